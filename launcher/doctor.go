package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/gorun-hpc/gorun/internal/plural"
	"github.com/gorun-hpc/gorun/launcher/plan"
	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// Doctor: pre-flight checks of every host before a big job. It starts the
// host agents exactly as a job would (same launcher, same authentication,
// same interface choice), so what passes here is what a job needs; then
// every agent probes every other host's chosen address over TCP and UDP —
// the two protocols the gossip layer uses — on a port it opened for the
// purpose. Nothing runs on the hosts afterwards.

// HostCheck is the verdict on one host.
type HostCheck struct {
	Host string
	// Agent is "" when the agent started and authenticated, else why not.
	Agent string
	// Version is the remote gorun's version ("" when unknown).
	Version string
	// Iface and Addr are the host's chosen interface and address.
	Iface, Addr string
	// Ports is "" when two free ports could be reserved, else why not.
	Ports string
	// Reached counts the peers this host reached out of Peers (the other
	// hosts whose agent answered); Unreached says which it did not and why.
	Reached   int
	Peers     int
	Unreached []string
	// GPUs is the count GPUProbe reports on the host (the CUDA driver
	// through nccl/ in a gorun with the GPU side, else nvidia-smi).
	GPUs int
	// Cgroup says whether jobs get a cgroup on the host, which contains
	// descendants that escape every other scan when a supervisor is
	// SIGKILLed, or why not (supervisor/cgroup_linux.go). Off is not a problem:
	// jobs run, with that one gap.
	Cgroup string
	// Problems lists everything wrong; empty means the host is ready.
	Problems []string
}

// OK reports whether the host passed every check.
func (c HostCheck) OK() bool { return len(c.Problems) == 0 }

// DoctorReport is the outcome of Doctor, one HostCheck per host in order.
type DoctorReport struct {
	Hosts []HostCheck
	// Gorun is where gorun itself listened (interface and address).
	Gorun string
	// GorunCgroup is Cgroup for the launching host, whose supervisor gorun
	// starts itself in a single-host job.
	GorunCgroup string
}

// OK reports whether every host passed.
func (r *DoctorReport) OK() bool {
	for _, h := range r.Hosts {
		if !h.OK() {
			return false
		}
	}
	return true
}

// WriteTable prints one line per host and a verdict.
func (r *DoctorReport) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tAGENT\tVERSION\tINTERFACE\tPORTS\tPEERS\tGPUS\tVERDICT")
	n := len(r.Hosts)
	for _, h := range r.Hosts {
		agent, ports, peers := "ok", "ok", fmt.Sprintf("%d/%d", h.Reached, h.Peers)
		if h.Agent != "" {
			agent, ports, peers = "FAIL", "-", "-"
		} else if h.Ports != "" {
			ports = "FAIL"
		}
		iface := "-"
		if h.Iface != "" {
			iface = h.Iface + " " + h.Addr
		}
		verdict := "ok"
		if !h.OK() {
			verdict = "FAIL: " + strings.Join(h.Problems, "; ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", h.Host, agent, orDefault(h.Version, "-"), iface, ports, peers, h.GPUs, verdict)
	}
	tw.Flush()
	fmt.Fprintf(w, "job cgroups on the launching host: %s\n", r.GorunCgroup)
	for _, h := range r.Hosts {
		if h.Cgroup != "" {
			fmt.Fprintf(w, "job cgroups on %s: %s\n", h.Host, h.Cgroup)
		}
	}
	bad := 0
	for _, h := range r.Hosts {
		if !h.OK() {
			bad++
		}
	}
	if bad == 0 {
		fmt.Fprintf(w, "all %d %s ready (gorun on %s)\n", n, plural.Noun(n, "host", "hosts"), r.Gorun)
	} else {
		fmt.Fprintf(w, "%d of %d %s not ready\n", bad, n, plural.Noun(n, "host", "hosts"))
	}
}

// Doctor checks hosts as a job over them would use them. The error is for
// gorun's own failures (no interface to listen on); host problems are in
// the report.
func Doctor(ctx context.Context, cfg Config, hosts []Host) (*DoctorReport, error) {
	if len(hosts) == 0 {
		return nil, errors.New("launcher: doctor needs hosts (-H, -hostfile or a SLURM allocation)")
	}
	var nodes []plan.Node
	seen := map[string]bool{}
	for _, h := range hosts {
		if !seen[h.Name] {
			seen[h.Name] = true
			nodes = append(nodes, plan.Node{Name: h.Name, Ranks: h.Slots})
		}
	}
	m, err := newHostAgents(cfg, nodes)
	if err != nil {
		return nil, err
	}
	m.use = useDoctor
	id := DetectLocal()
	if err := m.open(ctx, id); err != nil {
		return nil, err
	}
	defer m.ln.Close()
	defer m.abort()
	rep := &DoctorReport{Gorun: m.choice.Name + " " + m.addr.Addr().String(), GorunCgroup: supervisor.CgroupStatus()}
	checks := make([]HostCheck, len(nodes))
	for i, n := range nodes {
		checks[i].Host = n.Name
	}
	// The same start-up as a job's, judged differently: every host's
	// outcome is recorded, none ends the check.
	err = m.startHosts(ctx, id, func(node int, c *hostConn, err error) error {
		ck := &checks[node]
		if err != nil {
			problem := strings.TrimPrefix(err.Error(), "launcher: ")
			if ck.Agent == "" {
				ck.Agent = strings.TrimPrefix(problem, "host "+nodes[node].Name+": ")
			}
			return nil
		}
		h := c.hello
		ck.Version, ck.Iface, ck.Addr, ck.GPUs, ck.Cgroup = h.Version, h.Iface, h.Addr, h.GPUs, h.Cgroup
		if h.ErrKind == "ports" {
			ck.Ports = h.Err
		} else if h.Err != "" {
			ck.Agent = h.Err
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		// Not a host's fault: a starter (ssh, srun) cannot run at all.
		return nil, err
	}

	// All pairs: each connected host probes every other connected host.
	var peers []wire.PeerAddr
	for i, c := range m.conns {
		if c != nil && c.hello.ProbePort > 0 {
			peers = append(peers, wire.PeerAddr{Host: nodes[i].Name, Addr: net.JoinHostPort(c.hello.Addr, fmt.Sprint(c.hello.ProbePort))})
		}
	}
	var wg sync.WaitGroup
	for i, c := range m.conns {
		if c == nil {
			continue
		}
		wg.Go(func() {
			_ = c.w.NetConn().SetDeadline(time.Now().Add(30 * time.Second))
			if err := c.w.Send(wire.Msg{T: "probe", Peers: peers}); err != nil {
				checks[i].Unreached = append(checks[i].Unreached, "probe request failed: "+err.Error())
				return
			}
			msg, err := c.w.ReadMsg()
			if err != nil || msg.T != "probed" {
				checks[i].Unreached = append(checks[i].Unreached, fmt.Sprintf("no probe results: %v", err))
				return
			}
			for _, p := range peers {
				if p.Host == nodes[i].Name {
					continue
				}
				checks[i].Peers++
				if why, ok := msg.Probed[p.Host]; ok && why == "" {
					checks[i].Reached++
				} else {
					checks[i].Unreached = append(checks[i].Unreached, p.Host+": "+orDefault(why, "not probed"))
				}
			}
			sort.Strings(checks[i].Unreached)
		})
	}
	wg.Wait()

	for i := range checks {
		c := &checks[i]
		switch {
		case c.Agent != "":
			c.Problems = append(c.Problems, c.Agent)
		default:
			if c.Version != cfg.Version {
				c.Problems = append(c.Problems, fmt.Sprintf("gorun %s here, %s on the launching host", c.Version, cfg.Version))
			}
			if c.Ports != "" {
				c.Problems = append(c.Problems, "ports: "+c.Ports)
			}
			if len(c.Unreached) > 0 {
				c.Problems = append(c.Problems, "cannot reach "+strings.Join(c.Unreached, ", "))
			}
		}
	}
	rep.Hosts = checks
	return rep, ctx.Err()
}
