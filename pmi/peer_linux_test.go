package pmi

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// The owner of a loopback connection's other end is found: this process
// for its own connection.
func TestLoopbackPeerUID(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		ln, err := net.Listen(network, map[string]string{"tcp4": "127.0.0.1:0", "tcp6": "[::1]:0"}[network])
		if err != nil {
			t.Logf("%s: %v (skipped)", network, err)
			continue
		}
		c, err := net.Dial(network, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if uid, ok := loopbackPeerUID(s); !ok || uid != os.Getuid() {
			t.Errorf("%s: loopbackPeerUID = %d, %v; want %d", network, uid, ok, os.Getuid())
		}
		if err := checkPortPeer(s); err != nil {
			t.Errorf("%s: own connection refused: %v", network, err)
		}
		s.Close()
		c.Close()
		ln.Close()
	}
	if a, ok := parseProcAddr("0100007F:1F90"); !ok || a != netip.MustParseAddrPort("127.0.0.1:8080") {
		t.Errorf("parseProcAddr = %v %v", a, ok)
	}
}

// A process of another user (nobody, uid 65534) that knows a rank's PMI id
// is refused on the PMI port without an answer; the rank itself is then
// still served. Needs root to run the other user's process.
func TestPortRefusesAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as another user")
	}
	s, err := NewServer(Config{KVSName: "k", Size: 1, Ranks: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("/usr/bin/python3", "-c", `import socket,sys
c=socket.create_connection((sys.argv[1],int(sys.argv[2])))
c.sendall(("cmd=initack pmiid=%s\n"%sys.argv[3]).encode())
c.settimeout(10)
try:
    print("answer:"+c.recv(100).decode().strip())
except OSError as e:
    print("closed:", e)`, host, port, fmt.Sprint(s.ID(0)))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, _ := cmd.CombinedOutput()
	if o := strings.TrimSpace(string(out)); o != "answer:" && !strings.HasPrefix(o, "closed:") {
		t.Fatalf("another user's connection with the right PMI id got %q, want no answer", out)
	}
	// The id was not used up: the rank connects with it.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "cmd=initack pmiid=%d\n", s.ID(0))
	buf := make([]byte, 100)
	n, _ := c.Read(buf)
	if !strings.HasPrefix(string(buf[:n]), "cmd=initack") {
		t.Errorf("the rank got %q after the refusal, want cmd=initack", buf[:n])
	}
}
