// Command pmiscale runs a real MPI program's start-up over simulated hosts
// on this machine and counts what gorun would send each host for its PMI
// gets: every host has its own pmi.Server (as each host's supervisor does),
// the ranks are real processes of the program, told by
// PMI_process_mapping that they sit hosts × per apart, and the owner loop
// plays gorun's part (launcher/pmi.go's pmiFences) over a pmi.Store:
//
//	go run ./bench/pmiscale -prog ./mpiprog -hosts 32 -per 4 -mode batch,fetch barrier
//
// Modes, run one after the other in one go:
//
//	batch  a get is answered with its host's barrier batch (pmi.Store.Get)
//	fetch  a get is answered with its key alone (gorun before batches)
//
// It prints, per mode, the gets that crossed to the owner (round trips),
// the bytes the owner sent the busiest host and all hosts, both encoded
// as gorun's commands travel to a host (JSON in a 5-byte frame), and the
// program's wall time. -wire FILE logs every PMI request line the ranks
// sent, with its rank, to see what the MPI library really asks.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/pmi"
)

// cmd mirrors the fields of gorun's supervisor command that PMI answers
// use (launcher/wire's Cmd), so that bytes are counted as they travel.
type cmd struct {
	Op      string            `json:"op"`
	Epoch   int               `json:"epoch,omitempty"`
	KVS     map[string]string `json:"kvs,omitempty"`
	Key     string            `json:"key,omitempty"`
	Value   string            `json:"value,omitempty"`
	Found   bool              `json:"found,omitempty"`
	Batched bool              `json:"batched,omitempty"`
}

// wire mirrors the envelope a command travels in to a host agent.
type wire struct {
	T   string `json:"t"`
	Cmd *cmd   `json:"cmd,omitempty"`
}

type result struct {
	gets, fences  int
	busiest, all  int // bytes sent: to the busiest host, to all hosts
	wall          time.Duration
	failed        string
	keys, batched int // keys released; answers sent as Batched
}

func main() {
	prog := flag.String("prog", "", "the MPI program (built with MPICH's mpicc)")
	hosts := flag.Int("hosts", 4, "simulated hosts")
	per := flag.Int("per", 2, "ranks per host")
	modes := flag.String("mode", "batch,fetch", "comma-separated modes: batch, fetch")
	wireLog := flag.String("wire", "", "log every PMI request line to this file")
	timeout := flag.Duration("timeout", 5*time.Minute, "end a run after this long")
	flag.Parse()
	if *prog == "" || *hosts < 1 || *per < 1 {
		fmt.Fprintln(os.Stderr, "pmiscale: -prog is required; -hosts and -per must be at least 1")
		os.Exit(2)
	}
	fmt.Printf("%-6s %-6s %8s %6s %10s %12s %12s %8s  %s\n", "ranks", "mode", "gets", "fences", "batched", "busiest_B", "all_B", "wall", "note")
	failed := false
	for _, m := range strings.Split(*modes, ",") {
		if m != "batch" && m != "fetch" {
			fmt.Fprintf(os.Stderr, "pmiscale: unknown mode %q\n", m)
			os.Exit(2)
		}
		r := run(*prog, flag.Args(), *hosts, *per, m, *wireLog, *timeout)
		fmt.Printf("%-6d %-6s %8d %6d %10d %12d %12d %7.2fs  %s\n", *hosts**per, m, r.gets, r.fences, r.batched, r.busiest, r.all, r.wall.Seconds(), r.failed)
		failed = failed || r.failed != ""
	}
	if failed {
		os.Exit(1)
	}
}

// run starts the program on hosts × per ranks and plays gorun's side of
// PMI in mode until every rank exited.
func run(prog string, args []string, hosts, per int, mode, wireLog string, timeout time.Duration) result {
	var res result
	size := hosts * per
	counts := make([]int, hosts)
	for i := range counts {
		counts[i] = per
	}
	mapping, err := pmi.ProcessMapping(counts)
	if err != nil {
		res.failed = err.Error()
		return res
	}
	log := zerolog.Nop()
	if wireLog != "" {
		f, err := os.OpenFile(wireLog+"."+mode, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			res.failed = err.Error()
			return res
		}
		defer f.Close()
		log = zerolog.New(f).Level(zerolog.TraceLevel)
	}
	srvs, err := servers(hosts, per, mapping, log)
	if err != nil {
		res.failed = err.Error()
		return res
	}
	var serving sync.WaitGroup
	closeAll := sync.OnceFunc(func() {
		for _, s := range srvs {
			s.Close()
		}
		serving.Wait()
	})
	defer closeAll()

	// The owner: one goroutine, like gorun's event loop.
	reqs := make(chan hostReq)
	quit := make(chan struct{})
	var fwd sync.WaitGroup
	for h, s := range srvs {
		fwd.Go(func() {
			for req := range s.Requests() {
				select {
				case reqs <- hostReq{h, req}:
				case <-quit:
					return
				}
			}
		})
	}
	sent := make([]int, hosts)
	send := func(h int, c cmd) {
		b, _ := json.Marshal(wire{T: "cmd", Cmd: &c})
		sent[h] += len(b) + 5
	}
	var store pmi.Store
	ownerDone := make(chan struct{})
	go func() {
		defer close(ownerDone)
		own(reqs, quit, srvs, mode, &store, &res, send)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	var ranks sync.WaitGroup
	var mu sync.Mutex
	var outs []string
	for h, s := range srvs {
		for r := h * per; r < (h+1)*per; r++ {
			cmd, out, err := startRank(ctx, s, r, size, prog, args, &serving)
			if err != nil {
				res.failed = err.Error()
				break
			}
			ranks.Go(func() {
				if err := cmd.Wait(); err != nil && !errors.Is(err, exec.ErrWaitDelay) {
					mu.Lock()
					outs = append(outs, fmt.Sprintf("rank %d: %v %s", r, err, strings.TrimSpace(out.String())))
					mu.Unlock()
				}
			})
		}
	}
	ranks.Wait()
	res.wall = time.Since(start)
	close(quit)
	<-ownerDone
	closeAll() // ends the forwarders' ranges over Requests
	fwd.Wait()
	for _, b := range sent {
		res.busiest = max(res.busiest, b)
		res.all += b
	}
	res.keys = store.Len()
	if len(outs) > 0 && res.failed == "" {
		res.failed = fmt.Sprintf("%d ranks failed; first: %s", len(outs), outs[0])
	}
	return res
}

// hostReq is a request of host's PMI server, as gorun's event loop gets it.
type hostReq struct {
	host int
	req  pmi.Request
}

// servers are the hosts' PMI servers, per ranks each, fetching values on
// demand as gorun's do.
func servers(hosts, per int, mapping string, log zerolog.Logger) ([]*pmi.Server, error) {
	size := hosts * per
	srvs := make([]*pmi.Server, hosts)
	for h := range hosts {
		var ranks []int
		for r := h * per; r < (h+1)*per; r++ {
			ranks = append(ranks, r)
		}
		var err error
		srvs[h], err = pmi.NewServer(pmi.Config{KVSName: "gorun-pmiscale", Size: size, Ranks: ranks,
			ProcessMapping: mapping, Fetch: true, Logger: log.With().Int("host", h).Logger()})
		if err != nil {
			for _, s := range srvs[:h] {
				s.Close()
			}
			return nil, err
		}
	}
	return srvs, nil
}

// own plays gorun's event loop until quit: a barrier is released once
// every host fenced; a get is answered from the store, batched unless
// mode is "fetch". What goes to each host is counted by send.
func own(reqs <-chan hostReq, quit <-chan struct{}, srvs []*pmi.Server, mode string, store *pmi.Store, res *result, send func(int, cmd)) {
	hosts := len(srvs)
	epoch, seen := 0, 0
	for {
		var hr hostReq
		select {
		case hr = <-reqs:
		case <-quit:
			return
		}
		switch hr.req.Kind {
		case pmi.Fence:
			store.Fence(hr.host, hr.req.Puts)
			if seen++; seen < hosts {
				continue
			}
			store.Release()
			for h, s := range srvs {
				send(h, cmd{Op: "pmi-release", Epoch: epoch})
				_ = s.Release(epoch, nil)
			}
			res.fences++
			epoch, seen = epoch+1, 0
		case pmi.Get:
			res.gets++
			a := store.Get(hr.host, hr.req.Key)
			if mode == "fetch" {
				a.More, a.Batched = nil, false
			}
			c := cmd{Op: "pmi-value", Key: hr.req.Key, Value: a.Value, Found: a.Found, Batched: a.Batched, KVS: a.More}
			if a.Batched {
				c.Value, c.Found = "", false
				res.batched++
			}
			send(hr.host, c)
			if err := srvs[hr.host].AnswerBatch(hr.req.Key, a); err != nil {
				fmt.Fprintln(os.Stderr, "pmiscale:", err)
			}
		case pmi.Abort:
			fmt.Fprintf(os.Stderr, "pmiscale: rank %d aborted with code %d: %s\n", hr.req.Rank, hr.req.Code, hr.req.Message)
		}
	}
}

// startRank starts rank r of size with its PMI connection to s (served on
// serving), as a supervisor starts a rank: PMI_FD 3, the rank and size in
// the environment, killed with its parent. Its output goes to the builder.
func startRank(ctx context.Context, s *pmi.Server, r, size int, prog string, args []string, serving *sync.WaitGroup) (*exec.Cmd, *strings.Builder, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "pmi-server"), os.NewFile(uintptr(fds[1]), "pmi-rank")
	defer theirs.Close()
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return nil, nil, err
	}
	serving.Go(func() { _ = s.ServeConn(r, c) })
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Env = append(os.Environ(), "PMI_FD=3", "PMI_RANK="+strconv.Itoa(r), "PMI_SIZE="+strconv.Itoa(size))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return cmd, out, nil
}
