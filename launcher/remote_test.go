package launcher

import (
	"errors"
	"net"
	"reflect"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/outcome"
	"github.com/gorun-hpc/gorun/launcher/wire"
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
			w, h, err := acceptAgent(b, secret, "job1", known)
			if err == nil {
				_ = w.Send(wire.Msg{T: "job"})
			} else {
				b.Close()
			}
			done <- result{h, err}
		}()
		w, err := wire.DialAuth(a, agentSecret, "job1", host)
		if err == nil {
			// The agent's proof is checked after wire.DialAuth returns.
			_, err = w.ReadMsg()
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

	// A stranger claiming another protocol is a stranger: a
	// *HandshakeError that names no host, never a *outcome.VersionError.
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		_, _ = a.Write([]byte("GORUN-AGENT/9 job1 n1 00\n"))
		buf := make([]byte, 256)
		_, _ = a.Read(buf)
		a.Close()
	}()
	_, host, err := acceptAgent(b, secret, "job1", known)
	var ve *outcome.VersionError
	var he *wire.HandshakeError
	if errors.As(err, &ve) || !errors.As(err, &he) || host != "" || he.ClaimProtocol != "9" {
		t.Fatalf("unauthenticated foreign protocol: %v host %q, want a *HandshakeError and no host", err, host)
	}

	// An agent that holds the secret but speaks another protocol is that
	// host's *outcome.VersionError.
	a2, b2 := net.Pipe()
	defer a2.Close()
	go func() {
		_, _ = wire.DialAuthAs(a2, secret, "job1", "n1", "9")
		a2.Close()
	}()
	_, host, err = acceptAgent(b2, secret, "job1", known)
	if !errors.As(err, &ve) || host != "n1" || ve.Remote != "protocol 9" {
		t.Fatalf("authenticated foreign protocol: %v %q, want a *outcome.VersionError for n1", err, host)
	}
}
