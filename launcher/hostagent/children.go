package hostagent

import (
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/tailbuf"
	"github.com/gorun-hpc/gorun/launcher/sshkex"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// children are the agents a host agent started for gorun (tree fan-out):
// their launch commands (ssh) run as this agent's children for the job's
// lifetime. A command that exits is reported to gorun until setup is over;
// after that, gorun watches the child agents' own connections.
type children struct {
	mu     sync.Mutex
	silent bool // guarded by mu: setup is over, report nothing more
	cmds   []*exec.Cmd
	wg     sync.WaitGroup
}

func startChildren(launch []wire.ChildLaunch, secret string, w *wire.Conn, log zerolog.Logger) *children {
	k := &children{}
	for _, cl := range launch {
		argv := cl.Argv
		if cl.FastKex {
			argv = sshkex.Fast(argv)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		tail := &tailbuf.Buffer{}
		cmd.Stdout, cmd.Stderr = tail, tail
		cmd.Stdin = strings.NewReader(secret + "\n")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			k.report(w, wire.ChildExit{Host: cl.Host, Code: -1, Tail: err.Error()})
			continue
		}
		k.cmds = append(k.cmds, cmd)
		k.wg.Go(func() {
			_ = cmd.Wait()
			code := cmd.ProcessState.ExitCode()
			log.Debug().Str("child", cl.Host).Int("code", code).Msg("child agent's launcher exited")
			k.report(w, wire.ChildExit{Host: cl.Host, Code: code, Tail: tail.Tail()})
		})
	}
	return k
}

func (k *children) report(w *wire.Conn, e wire.ChildExit) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.silent {
		_ = w.Send(wire.Msg{T: "child-exit", Child: &e})
	}
}

// quiet ends the reports: after it returns none is sent.
func (k *children) quiet() {
	k.mu.Lock()
	k.silent = true
	k.mu.Unlock()
}

// stop waits up to d for the launch commands to end with their agents,
// then kills the rest (an ssh to a host whose link is cut could hang for
// long). The child agents themselves never depend on these commands: their
// own connections to gorun decide their fate, and they survive losing
// their stdio (SIGPIPE is caught in Main).
func (k *children) stop(d time.Duration) {
	k.quiet()
	done := make(chan struct{})
	go func() { k.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(d):
	}
	for _, c := range k.cmds {
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
	<-done
}
