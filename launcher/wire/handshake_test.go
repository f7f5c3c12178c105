package wire

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/internal/handshake"
)

// The host agent's proof is pinned to a vector computed outside Go (HMAC-
// SHA256 over "gorun/3\x00job-7\x00node01\x00<nonceA>\x00<nonceB>\x00"):
// agents and gorun of different builds must keep computing the same bytes.
func TestAgentProofFixedVector(t *testing.T) {
	got, err := handshake.MAC([]byte("job-secret"), proofFields("gorun", "3", "job-7", "node01",
		"00112233445566778899aabbccddeeff", "ffeeddccbbaa99887766554433221100")...)
	if want := "a586d32ec57bbdb8dca59fb44284dca8a602c1dd6c43fbbe93b411fc1dffe01e"; err != nil || got != want {
		t.Fatalf("agent proof = %q, %v; want %q", got, err, want)
	}
}

// A greeting whose nonce holds a NUL byte cannot be bound into a MAC
// unambiguously: gorun answers NO and drops it as a stranger.
func TestAcceptRefusesNULInGreeting(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	reply := make(chan string, 1)
	go func() {
		_, _ = a.Write([]byte("GORUN-AGENT/" + Protocol + " job1 n1 ab\x00cd\n"))
		buf := make([]byte, 256)
		n, _ := a.Read(buf)
		reply <- string(buf[:n])
		a.Close()
	}()
	_, host, err := AcceptAuth(b, []byte("secret"), "job1", func(h string) bool { return h == "n1" })
	var he *HandshakeError
	if !errors.As(err, &he) || !errors.Is(err, handshake.ErrField) || host != "" {
		t.Fatalf("greeting with a NUL: %v host %q, want a *HandshakeError wrapping ErrField", err, host)
	}
	if r := <-reply; !strings.HasPrefix(r, "NO ") {
		t.Fatalf("gorun answered %q, want a NO", r)
	}
}
