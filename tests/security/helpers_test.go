package security

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/tests/outsider"
)

// Environment of the helper processes.
const (
	modeEnv   = "GORUN_SECURITY_MODE" // "rank" or "attack"
	goFileEnv = "GORUN_SECURITY_GO"   // a rank waits for this file before its all-reduce
)

// maybeHelper runs the helper the environment asks for and exits.
func maybeHelper() {
	switch os.Getenv(modeEnv) {
	case "":
		return
	case "rank":
		os.Exit(rankMain())
	case "attack":
		os.Exit(attackMain(os.Args[1:]))
	case "show":
		// A rank that prints who it runs as and each file named in its
		// arguments, so a test sees what the rank read.
		fmt.Printf("RANK uid=%d\n", os.Getuid())
		for _, f := range os.Args[1:] {
			b, err := os.ReadFile(f)
			fmt.Printf("FILE %s %q %v\n", f, b, err)
		}
		os.Exit(0)
	}
}

// rankMain: listen, form the world, say where the data port is, wait for
// the go file, then all-reduce rank+1 over 1 Mi float64s and check the
// sum on every element.
func rankMain() int {
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "rank: %s: %v\n", what, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rc, err := rendezvous.ConfigFromEnv()
	if err != nil {
		return fail("config", err)
	}
	host := "127.0.0.1"
	if seed := rc.Seed; seed != "" {
		if c, err := net.Dial("udp", seed); err == nil {
			host, _, _ = net.SplitHostPort(c.LocalAddr().String())
			c.Close()
		}
	}
	ep, err := comm.Listen(comm.EndpointConfig{Addr: net.JoinHostPort(host, "0"), Secret: rc.Secret})
	if err != nil {
		return fail("listen", err)
	}
	defer ep.Close()
	rc.DataAddr = ep.Addr()
	w, err := rendezvous.Join(ctx, rc)
	if err != nil {
		return fail("join", err)
	}
	defer w.Close()
	fmt.Printf("DATA %d %s %d\n", w.Rank(), ep.Addr(), os.Getpid())
	if f := os.Getenv(goFileEnv); f != "" {
		for {
			if _, err := os.Stat(f); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fail("wait for the go file", ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	c, err := comm.New(ctx, w, ep, comm.DefaultConfig())
	if err != nil {
		return fail("communicator", err)
	}
	defer c.Close()
	const n = 1 << 20
	send, recv := make([]float64, n), make([]float64, n)
	for i := range send {
		send[i] = float64(w.Rank() + 1)
	}
	if err := c.AllReduce(ctx, comm.Float64s(send), comm.Float64s(recv), comm.Sum).Wait(ctx); err != nil {
		return fail("all-reduce", err)
	}
	want := float64(w.Size() * (w.Size() + 1) / 2)
	for i, v := range recv {
		if v != want {
			return fail("result", fmt.Errorf("element %d is %v, want %v", i, v, want))
		}
	}
	fmt.Printf("RESULT %d ok %v\n", w.Rank(), want)
	return 0
}

// attackMain is the attacker, run as the second user:
//
//	agent-port DUR PREFIX   watch /proc for host agents' command lines (for hosts named
//	                        PREFIX*, sparing other tests' jobs on this machine) and, for each
//	                        gorun address seen, send hellos claiming protocol 9 for
//	                        the job and host they name, and hold 300 silent connections
//	squat-watch HOST DUR    watch for HOST's agent and bind @gorun-<job>-<HOST> (the
//	                        name the attach socket once had), then connect to every
//	                        @gorun-* socket on this host's network, 200 times each;
//	                        ends a second after connecting, or after DUR
//	attach DUR NAME...      connect 200 times to each named attach socket (a test on
//	                        the shared host names its own job's, sparing other jobs)
//	agent-flood PREFIX N DUR  wait for the first host agent's command line (hosts named
//	                        PREFIX*) and keep N connections to the gorun address it
//	                        names open for DUR, redialing each one gorun closes
//	hold ADDR N DUR         open N connections to ADDR and hold them
//	churn ADDR N DUR        keep N connections to ADDR open, redialing each one the
//	                        server closes (memberlist closes silent ones after 2 s)
//	read-secrets            try to read every process's environ; print what was readable
//	plant DIR...            create each DIR world-writable with a planted "prog.sh"
//	link DIR NAME TARGET    create DIR (mode 0777) with NAME a symlink to TARGET
//	put DIR NAME TEXT       create DIR (mode 0777) with NAME a 0666 file holding TEXT
//
// Each prints one "ATTACK <mode> <result>" line.
func attackMain(args []string) int {
	if len(args) == 0 {
		return 2
	}
	dur := func(s string) time.Duration { d, _ := time.ParseDuration(s); return d }
	switch args[0] {
	case "agent-port":
		return attackAgentPort(dur(args[1]), args[2])
	case "agent-flood":
		n, _ := strconv.Atoi(args[2])
		return attackAgentFlood(args[1], n, dur(args[3]))
	case "squat-watch":
		return attackSquat(args[1], dur(args[2]), nil)
	case "attach":
		only := map[string]bool{}
		for _, n := range args[2:] {
			only[n] = true
		}
		return attackSquat("", dur(args[1]), only)
	case "churn":
		n, _ := strconv.Atoi(args[2])
		return attackChurn(args[1], n, dur(args[3]))
	case "hold":
		n, _ := strconv.Atoi(args[2])
		conns := holdConns(args[1], n)
		fmt.Printf("ATTACK hold %s %d\n", args[1], len(conns))
		time.Sleep(dur(args[3]))
		return 0
	case "read-secrets":
		return attackReadSecrets()
	case "link", "put":
		if err := os.MkdirAll(args[1], 0o777); err != nil {
			fmt.Println("ATTACK", args[0], err)
			return 1
		}
		_ = os.Chmod(args[1], 0o777)
		p := filepath.Join(args[1], args[2])
		var err error
		if args[0] == "link" {
			err = os.Symlink(args[3], p)
		} else if err = os.WriteFile(p, []byte(args[3]), 0o666); err == nil {
			err = os.Chmod(p, 0o666)
		}
		if err != nil {
			fmt.Println("ATTACK", args[0], err)
			return 1
		}
		fmt.Println("ATTACK", args[0], "done")
		return 0
	case "plant":
		for _, d := range args[1:] {
			_ = os.MkdirAll(d, 0o777)
			_ = os.Chmod(d, 0o777)
			p := filepath.Join(d, "prog.sh")
			_ = os.WriteFile(p, []byte("#!/bin/sh\necho PWNED\ntouch /tmp/gorun-security-pwned\n"), 0o777)
			_ = os.Chmod(p, 0o777)
		}
		fmt.Println("ATTACK plant done")
		return 0
	}
	return 2
}

// agentCmdlines returns the (connect, job, host) of every host agent whose
// command line is visible in /proc (ps shows them to every user).
func agentCmdlines() [][3]string {
	var out [][3]string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		a := strings.Split(string(b), "\x00")
		var c [3]string
		for i := 0; i+1 < len(a); i++ {
			switch a[i] {
			case "--connect":
				c[0] = a[i+1]
			case "--job":
				c[1] = a[i+1]
			case "--host":
				c[2] = a[i+1]
			}
		}
		if c[0] != "" && c[1] != "" && c[2] != "" {
			out = append(out, c)
		}
	}
	return out
}

func attackAgentPort(d time.Duration, prefix string) int {
	end := time.Now().Add(d)
	hellos := 0
	var held []net.Conn
	// Held connections come from another source address (127.0.0.2) than
	// the hellos: from one source they would fill its share of the port's
	// handshake slots and keep the hellos out.
	seen := map[[3]string]bool{}
	holding := map[string]bool{}
	for time.Now().Before(end) {
		for _, c := range agentCmdlines() {
			if !strings.HasPrefix(c[2], prefix) {
				continue
			}
			seen[c] = true
			if !holding[c[0]] {
				holding[c[0]] = true
				held = append(held, holdConnsFrom(c[0], 300, "127.0.0.2")...)
			}
			conn, err := net.DialTimeout("tcp", c[0], time.Second)
			if err != nil {
				continue
			}
			var nonce [16]byte
			_, _ = rand.Read(nonce[:])
			fmt.Fprintf(conn, "GORUN-AGENT/9 %s %s %s\n", c[1], c[2], hex.EncodeToString(nonce[:]))
			_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			_, _ = bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			hellos++
		}
		time.Sleep(2 * time.Millisecond)
	}
	// gorun closes every connection of a stranger: the ones over the
	// per-source bound at once, the rest when its setup ends.
	open := 0
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && isTimeout(err) {
			open++
		}
	}
	fmt.Printf("ATTACK agent-port hellos=%d held=%d still-open=%d targets=%d\n", hellos, len(held), open, len(seen))
	return 0
}

// attackAgentFlood is an outsider on a job host, where it shares the
// address the host's agent connects from: it reads gorun's address from
// the first agent's command line and keeps n silent connections open to
// it, redialing each one gorun closes, so that gorun's port is as full as
// one user can make it when the next agent connects.
func attackAgentFlood(prefix string, n int, d time.Duration) int {
	end := time.Now().Add(d)
	addr := ""
	for addr == "" && time.Now().Before(end) {
		for _, c := range agentCmdlines() {
			if strings.HasPrefix(c[2], prefix) {
				addr = c[0]
				break
			}
		}
		time.Sleep(time.Millisecond)
	}
	if addr == "" {
		fmt.Println("ATTACK agent-flood no agent seen")
		return 1
	}
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	f := outsider.NewFlood(ctx)
	f.Hold(addr, n)
	dials, peak := f.Wait()
	fmt.Printf("ATTACK agent-flood %s dials=%d peak-open=%d\n", addr, dials, peak)
	return 0
}

// attackChurn keeps n connections open to addr for d, dialing again each
// one the other side closes.
func attackChurn(addr string, n int, d time.Duration) int {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	f := outsider.NewFlood(ctx)
	f.Hold(addr, n)
	dials, _ := f.Wait()
	fmt.Printf("ATTACK churn %s dials=%d\n", addr, dials)
	return 0
}

func holdConns(addr string, n int) []net.Conn { return holdConnsFrom(addr, n, "") }

func holdConnsFrom(addr string, n int, from string) []net.Conn {
	var out []net.Conn
	d := net.Dialer{Timeout: time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			break
		}
		out = append(out, c)
	}
	return out
}

func attackSquat(host string, d time.Duration, only map[string]bool) int {
	end := time.Now().Add(d)
	var squatted []net.Listener
	var attached []net.Conn
	named := map[string]bool{}
	for time.Now().Before(end) {
		for _, c := range agentCmdlines() {
			name := "gorun-" + c[1] + "-" + c[2]
			if host == "" || c[2] != host || named[name] {
				continue
			}
			named[name] = true
			if ln, err := net.Listen("unix", "@"+name); err == nil {
				squatted = append(squatted, ln)
			}
		}
		// Connect to every gorun attach socket on this network namespace.
		b, _ := os.ReadFile("/proc/net/unix")
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 || !strings.HasPrefix(f[7], "@gorun-") || named[f[7][1:]] || f[5] != "01" {
				continue
			}
			if only != nil && !only[f[7][1:]] {
				continue
			}
			named[f[7][1:]] = true
			for range 200 {
				if c, err := net.Dial("unix", f[7]); err == nil {
					attached = append(attached, c)
				}
			}
		}
		if len(attached) > 0 && len(named) > len(squatted) {
			// Connected to the job's sockets: give the leaders a moment
			// to answer, then report.
			time.Sleep(time.Second)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// How many of the held attach connections the leader already closed
	// (SO_PEERCRED refuses another user at once).
	closed := 0
	for _, c := range attached {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			closed++
		}
	}
	fmt.Printf("ATTACK squat-watch squatted=%d attached=%d closed-by-leader=%d\n", len(squatted), len(attached), closed)
	return 0
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func attackReadSecrets() int {
	readable := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err == nil && strings.Contains(string(b), "GORUN_SECRET=") {
			readable++
		}
	}
	shm := 0
	ents, _ = os.ReadDir("/dev/shm")
	for _, e := range ents {
		if f, err := os.Open("/dev/shm/" + e.Name()); err == nil {
			f.Close()
			shm++
		} else if !os.IsPermission(err) && !errorsIs(err, syscall.ENOENT) {
			shm++
		}
	}
	// gorun's temporary directories (flight records of a single-host job).
	tmp := 0
	dirs, _ := filepath.Glob("/tmp/gorun-flight-*")
	for _, d := range dirs {
		if st, err := os.Stat(d); err != nil || !st.IsDir() || st.Sys().(*syscall.Stat_t).Uid == uint32(os.Getuid()) {
			continue
		}
		if _, err := os.ReadDir(d); err == nil {
			tmp++
		}
	}
	fmt.Printf("ATTACK read-secrets environ-with-secret=%d shm-openable=%d tmp-listable=%d\n", readable, shm, tmp)
	return 0
}

func errorsIs(err error, target syscall.Errno) bool {
	pe, ok := err.(*os.PathError)
	return ok && pe.Err == target
}
