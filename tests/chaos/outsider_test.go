package chaos

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gorun-hpc/gorun/tests/outsider"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// floodEnv makes this binary the outsider of the "outsider" rows: it
// reads addresses on stdin, one a line, and keeps the number of
// connections the variable says open to each, redialing every one the
// other side closes, until stdin ends; then it prints how many it dialed.
const floodEnv = "GORUN_CHAOS_FLOOD"

// maybeFlooder runs the outsider when the environment asks for it.
func maybeFlooder() {
	n, err := strconv.Atoi(os.Getenv(floodEnv))
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := outsider.NewFlood(ctx)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f.Hold(strings.TrimSpace(sc.Text()), n)
	}
	cancel()
	dials, _ := f.Wait()
	fmt.Printf("flood dials=%d\n", dials)
	os.Exit(0)
}

// outsiderFlood is the fault of the "outsider" rows: from the moment the
// job starts until it ends (or d), a process of another user (nobody) on
// each namespace host keeps n connections open to every TCP port the other
// hosts listen on (found with ss as the ranks open them: gossip and the
// data plane), redialing each one closed. It shares the address that
// host's ranks connect from, as any user of a job host does. The job must
// form and finish as if the outsider were not there.
func outsiderFlood(n int, d time.Duration) func(h *testhosts.Netns, ready <-chan struct{}) (cutSpan, error) {
	return func(h *testhosts.Netns, ready <-chan struct{}) (cutSpan, error) {
		var span cutSpan
		bin, err := publicCopy(selfBin)
		if err != nil {
			return span, err
		}
		defer os.RemoveAll(filepath.Dir(bin))
		type flooder struct {
			cmd  *exec.Cmd
			in   io.WriteCloser
			out  bytes.Buffer
			seen map[string]bool
		}
		var fs []*flooder
		defer func() {
			for _, f := range fs {
				_ = f.in.Close()
				done := make(chan struct{})
				go func() { _ = f.cmd.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					_ = f.cmd.Process.Kill()
					<-done
				}
			}
		}()
		for _, host := range h.Hosts {
			f := &flooder{seen: map[string]bool{}}
			f.cmd = exec.Command("ip", "netns", "exec", host, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
				"env", floodEnv+"="+strconv.Itoa(n), bin)
			f.cmd.Stdout, f.cmd.Stderr = &f.out, &f.out
			if f.in, err = f.cmd.StdinPipe(); err != nil {
				return span, err
			}
			if err := f.cmd.Start(); err != nil {
				return span, err
			}
			fs = append(fs, f)
		}
		span.start = time.Now()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		// Until d, or the job's end: ready closed (it never got going),
		// or every port seen closed again.
		for ; time.Since(span.start) < d; <-tick.C {
			select {
			case _, ok := <-ready:
				if !ok {
					d = 0
				}
			default:
			}
			open := 0
			for target, host := range h.Hosts {
				ports, err := listening(host)
				if err != nil {
					return span, err
				}
				open += len(ports)
				for i, f := range fs {
					for _, p := range ports {
						addr := net.JoinHostPort(h.Addrs[target], p)
						if i != target && !f.seen[addr] {
							f.seen[addr] = true
							fmt.Fprintln(f.in, addr)
						}
					}
				}
			}
			if open == 0 && len(fs[0].seen) > 0 {
				break
			}
		}
		span.end = time.Now()
		for _, f := range fs {
			_ = f.in.Close()
			_ = f.cmd.Wait()
			m := regexp.MustCompile(`flood dials=(\d+)`).FindStringSubmatch(f.out.String())
			if len(f.seen) == 0 || m == nil {
				return span, fmt.Errorf("an outsider flooded no port (%d seen): %s", len(f.seen), f.out.String())
			}
			if k, _ := strconv.Atoi(m[1]); k < n {
				return span, fmt.Errorf("an outsider dialed only %d connections to %d ports", k, len(f.seen))
			}
		}
		fs = nil
		return span, nil
	}
}

// listening returns the TCP ports host listens on, but sshd's.
func listening(host string) ([]string, error) {
	out, err := exec.Command("ip", "netns", "exec", host, "ss", "-ltnH").Output()
	if err != nil {
		return nil, fmt.Errorf("ss in %s: %w", host, err)
	}
	var ports []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		_, port, err := net.SplitHostPort(f[3])
		if err == nil && port != "22" {
			ports = append(ports, port)
		}
	}
	return ports, nil
}

// publicCopy copies bin into a new directory that every user may read and
// run, for a process of another user.
func publicCopy(bin string) (string, error) {
	dir, err := os.MkdirTemp("", "gorun-chaos-outsider-")
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, filepath.Base(bin))
	err = os.Chmod(dir, 0o755)
	if err == nil {
		var b []byte
		if b, err = os.ReadFile(bin); err == nil {
			err = os.WriteFile(dst, b, 0o755)
		}
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", errors.Join(errors.New("copying the outsider's binary"), err)
	}
	return dst, nil
}
