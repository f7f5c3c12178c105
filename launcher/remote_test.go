package launcher

import (
	"errors"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

func TestSSHCommand(t *testing.T) {
	args := []string{"/opt/gorun dir/gorun", "agent", "--connect", "10.0.0.1:4000"}
	tests := []struct {
		template []string
		want     []string
	}{
		{nil, []string{"ssh", "-o", "BatchMode=yes", "-T", "n1", "'/opt/gorun dir/gorun'", "agent", "--connect", "10.0.0.1:4000"}},
		{[]string{"ssh", "-p", "2222"}, []string{"ssh", "-o", "BatchMode=yes", "-T", "-p", "2222", "n1", "'/opt/gorun dir/gorun'", "agent", "--connect", "10.0.0.1:4000"}},
		{[]string{"ip", "netns", "exec", "{host}"}, []string{"ip", "netns", "exec", "n1", "/opt/gorun dir/gorun", "agent", "--connect", "10.0.0.1:4000"}},
		{[]string{"/usr/bin/ssh", "{host}.cluster"}, []string{"/usr/bin/ssh", "-o", "BatchMode=yes", "-T", "n1.cluster", "'/opt/gorun dir/gorun'", "agent", "--connect", "10.0.0.1:4000"}},
	}
	for _, tc := range tests {
		if got := sshCommand(tc.template, "n1", args); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("sshCommand(%q) = %q, want %q", tc.template, got, tc.want)
		}
	}
	if got := shellQuote("it's"); got != `'it'\''s'` {
		t.Errorf("shellQuote = %s", got)
	}
}

// The handshake admits an agent holding the secret and refuses one that
// does not, or speaks another protocol, naming the host in the latter case.
func TestWireHandshake(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	known := func(h string) bool { return h == "n1" }
	type result struct {
		host string
		err  error
	}
	try := func(agentSecret []byte, host string) (agentErr error, gorun result) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		done := make(chan result, 1)
		go func() {
			w, h, err := acceptAuth(b, secret, "job1", known)
			if err == nil {
				_ = w.send(wireMsg{T: "job"})
			} else {
				b.Close()
			}
			done <- result{h, err}
		}()
		w, err := dialAuth(a, agentSecret, "job1", host)
		if err == nil {
			// The agent's proof is checked after dialAuth returns.
			_, err = w.readMsg()
		}
		// A refusing agent hangs up, as the real one does when it exits.
		a.Close()
		return err, <-done
	}
	if aerr, g := try(secret, "n1"); aerr != nil || g.err != nil || g.host != "n1" {
		t.Fatalf("good secret: agent %v, gorun %v %q", aerr, g.err, g.host)
	}
	if aerr, g := try([]byte("wrong"), "n1"); aerr == nil || g.err == nil {
		t.Fatalf("wrong secret admitted: agent %v, gorun %v", aerr, g.err)
	}
	if aerr, g := try(secret, "stranger"); aerr == nil || g.err == nil {
		t.Fatalf("unknown host admitted: agent %v, gorun %v", aerr, g.err)
	}

	// Another protocol version.
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		_, _ = a.Write([]byte("GORUN-AGENT/0 job1 n1 00\n"))
		buf := make([]byte, 256)
		_, _ = a.Read(buf)
		a.Close()
	}()
	_, host, err := acceptAuth(b, secret, "job1", known)
	var ve *VersionError
	if !errors.As(err, &ve) || host != "n1" {
		t.Fatalf("old protocol: %v %q, want a *VersionError for n1", err, host)
	}
}

// A preloaded file is placed only when its content matches the offered
// hash, and a present file with the same content is recognised.
func TestPreloadPlace(t *testing.T) {
	dir := t.TempDir()
	src := dir + "/src.bin"
	if err := os.WriteFile(src, []byte("the program"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := newPreloadSource(src, false)
	if err != nil {
		t.Fatal(err)
	}
	z, err := s.compressed()
	if err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	path, present := preloadPlace(s.info, dest)
	if present || path != dest+"/src.bin" {
		t.Fatalf("preloadPlace = %q, %v before the transfer", path, present)
	}
	dec, _ := zstd.NewReader(nil)
	defer dec.Close()
	bad := s.info
	bad.SHA256 = strings.Repeat("0", 64)
	if err := placeFile(dec, z, bad, path); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("placeFile with a wrong hash: %v", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("a damaged file was placed")
	}
	if err := placeFile(dec, z, s.info, path); err != nil {
		t.Fatal(err)
	}
	if _, present := preloadPlace(s.info, dest); !present {
		t.Fatal("placed file not recognised as present")
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", st.Mode())
	}
}
