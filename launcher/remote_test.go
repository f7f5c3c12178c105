package launcher

import (
	"errors"
	"net"
	"reflect"
	"testing"

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
	// *HandshakeError that names no host, never a *VersionError.
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		_, _ = a.Write([]byte("GORUN-AGENT/9 job1 n1 00\n"))
		buf := make([]byte, 256)
		_, _ = a.Read(buf)
		a.Close()
	}()
	_, host, err := acceptAgent(b, secret, "job1", known)
	var ve *VersionError
	var he *wire.HandshakeError
	if errors.As(err, &ve) || !errors.As(err, &he) || host != "" || he.ClaimProtocol != "9" {
		t.Fatalf("unauthenticated foreign protocol: %v host %q, want a *HandshakeError and no host", err, host)
	}

	// An agent that holds the secret but speaks another protocol is that
	// host's *VersionError.
	a2, b2 := net.Pipe()
	defer a2.Close()
	go func() {
		_, _ = wire.DialAuthAs(a2, secret, "job1", "n1", "9")
		a2.Close()
	}()
	_, host, err = acceptAgent(b2, secret, "job1", known)
	if !errors.As(err, &ve) || host != "n1" || ve.Remote != "protocol 9" {
		t.Fatalf("authenticated foreign protocol: %v %q, want a *VersionError for n1", err, host)
	}
}

func TestFastKex(t *testing.T) {
	for _, tc := range []struct {
		out          string
		major, minor int
		ok           bool
	}{
		{"OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 27 Jan 2026", 9, 2, true},
		{"OpenSSH_10.0p2, OpenSSL 3.5.0", 10, 0, true},
		{"OpenSSH_8.0p1, OpenSSL 1.1.1k  FIPS 25 Mar 2021", 8, 0, true},
		{"Dropbear v2022.83", 0, 0, false},
		{"", 0, 0, false},
	} {
		major, minor, ok := parseOpenSSHVersion(tc.out)
		if major != tc.major || minor != tc.minor || ok != tc.ok {
			t.Errorf("parseOpenSSHVersion(%q) = %d, %d, %v; want %d, %d, %v", tc.out, major, minor, ok, tc.major, tc.minor, tc.ok)
		}
	}
	ssh := []string{"/usr/bin/ssh", "-F", "cfg", "n1", "gorun", "agent"}
	want := append([]string{"/usr/bin/ssh", "-o", fastKexOption}, ssh[1:]...)
	if got := fastKexFor(ssh, 9, 2); !reflect.DeepEqual(got, want) {
		t.Errorf("OpenSSH 9.2: %q, want %q", got, want)
	}
	if got := fastKexFor(ssh, 10, 1); !reflect.DeepEqual(got, want) {
		t.Errorf("OpenSSH 10.1: %q, want %q", got, want)
	}
	// Clients before 9.0 already default to curve25519 (and 8.6 and older
	// reject the '^' syntax); unknown clients and other commands are left
	// alone, and so is a template that picks its own key exchange.
	for _, tc := range []struct {
		argv         []string
		major, minor int
	}{
		{ssh, 8, 9},
		{ssh, 0, 0},
		{[]string{"ip", "netns", "exec", "n1", "gorun"}, 9, 2},
		{[]string{"ssh", "-o", "KexAlgorithms=diffie-hellman-group14-sha256", "n1"}, 9, 2},
		{nil, 9, 2},
	} {
		if got := fastKexFor(tc.argv, tc.major, tc.minor); !reflect.DeepEqual(got, tc.argv) {
			t.Errorf("fastKexFor(%q, %d.%d) = %q, want it unchanged", tc.argv, tc.major, tc.minor, got)
		}
	}
}
