package rendezvous

import (
	"bufio"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous/rendezvoustest"
)

// The attach socket's name comes from the job secret, so nobody can take
// it before the leader; should another user's process hold it anyway (it
// learned the secret-derived name once, say), both sides say so at once
// instead of timing out: the attached rank refuses the other user's
// socket (SO_PEERCRED) and the leader reports the name as taken. The
// squatter runs as nobody (uid 65534), so the test needs root.
func TestAttachNameHeldByAnotherUser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as another user")
	}
	job := uniqueJob("squat")
	secret, _ := hex.DecodeString(hexSecret)
	key, err := attachKey(&Config{Secret: secret, JobID: job})
	if err != nil {
		t.Fatal(err)
	}
	name := attachName(key, "host0")
	sq := exec.Command("/usr/bin/python3", "-c",
		"import socket,sys,time\ns=socket.socket(socket.AF_UNIX)\ns.bind('\\0'+sys.argv[1])\ns.listen(64)\nprint('bound',flush=True)\ntime.sleep(60)", name)
	sq.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, Pdeathsig: syscall.SIGKILL}
	out, err := sq.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sq.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sq.Process.Kill(); _ = sq.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "bound\n" {
		t.Fatalf("squatter: %q %v", line, err)
	}
	seed := rendezvoustest.FreeSeed(t)

	// The attached rank: a *PeerError naming the squatter within moments,
	// although formation would wait 30 s.
	start := time.Now()
	p := startRank(t, "barrier", append(hierEnv(job, seed, 1, 2, 2), EnvRdzvTimeout+"=30s"))
	code := p.wait(t)
	took := time.Since(start)
	t.Logf("attached rank after %s: %s", took.Round(time.Millisecond), strings.TrimSpace(p.output()))
	if code == 0 || !strings.Contains(p.output(), "not this job's user") || took > 10*time.Second {
		t.Errorf("attached rank: exit %d after %s, output:\n%s\nwant a failure naming the other user's socket within 10 s", code, took, p.output())
	}

	// The leader: the name is taken, said as such.
	p = startRank(t, "barrier", append(hierEnv(job, seed, 0, 2, 2), EnvRdzvTimeout+"=30s"))
	code = p.wait(t)
	t.Logf("leader: %s", strings.TrimSpace(p.output()))
	if code == 0 || !strings.Contains(p.output(), "already taken") {
		t.Errorf("leader: exit %d, output:\n%s\nwant the attach name reported as taken", code, p.output())
	}
}

// Unix attach listeners report a taken name with ErrAttachNameTaken.
func TestUnixAttachNameTaken(t *testing.T) {
	name := "gorun-test-" + uniqueJob("taken")
	ln, err := unixAttach{}.Listen(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = unixAttach{}.Listen(name)
	if !errors.Is(err, ErrAttachNameTaken) {
		t.Fatalf("second Listen: %v, want ErrAttachNameTaken", err)
	}
	// And a connection from this user passes the credential check.
	c, err := net.Dial("unix", "@"+name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := checkPeer(s); err != nil {
		t.Errorf("same-user peer refused: %v", err)
	}
	if uid, pid, ok := peerCred(s); !ok || uid != os.Getuid() || pid != os.Getpid() {
		t.Errorf("peerCred = %d %d %v, want this process", uid, pid, ok)
	}
}
