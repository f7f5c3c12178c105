package main

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"math"
	"net"
	"os/exec"
	"sort"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/rendezvous"
	"github.com/gorun-hpc/gorun/sim"
)

// measureCosts measures every cost of sim.Costs that this machine can
// measure, from the real code (runReal) and, for the launch, from real
// processes; the rest comes from figures measured earlier in the
// repository, named in Source. logf reports progress and every fit.
func measureCosts(rounds int, gorunBin string, rss []rssPoint, logf func(string, ...any)) (sim.Costs, error) {
	c := sim.Costs{Source: map[string]string{}}
	// C first: a formed world of 16 hosts × 2, idle (no attach beats):
	// process CPU ÷ packets is a packet's cost (the members' idle timers
	// included: charged to the packets they send), bytes ÷ packets a
	// probe's size.
	idle, err := medianRun(rounds, 16, 2, 3*time.Second)
	if err != nil {
		return c, err
	}
	if idle.idlePackets == 0 {
		return c, fmt.Errorf("idle 16×2 world sent no packets in %v", idle.idle)
	}
	c.Packet = idle.idleCPU / time.Duration(idle.idlePackets)
	c.PingBytes = int(idle.idleBytes / idle.idlePackets)
	logf("  idle 16×2: %d packets, %d bytes, cpu %.1f ms in %v → Packet %v, %d B", idle.idlePackets, idle.idleBytes, ms(idle.idleCPU), idle.idle, c.Packet, c.PingBytes)
	c.GoneBytes = c.PingBytes
	c.Source["gone_bytes"] = "taken as a probe packet's size (same envelope: label, encryption; a few bytes of body)"

	// A and B: formations of 1 host × P (no gossip member but the seed)
	// and of H hosts × P; the process CPU of each is fitted, packets
	// charged at Packet, as
	//   LeaderStart·H + Attach·H(P−1) + TableEntry·N² + PushPull·2·streams + StateByte·stream bytes
	// (a rank pays per member of the world: its table entry and member
	// state; a push-pull is paid at both ends). Non-negative least squares.
	var xs [][]float64
	var ycpu, ybytes []float64
	var xb [][]float64
	var xd [][]float64
	var yd []float64
	var fpkts, fbytes int64 // formation packets and their bytes, for GossipMsg
	shapes := [][2]int{{1, 16}, {1, 64}, {1, 256}, {1, 512}, {1, 1024}, {4, 2}, {8, 2}, {16, 2}, {32, 2}, {8, 16}, {16, 8}, {16, 16}, {32, 8}, {16, 4}}
	for _, hp := range shapes {
		h, p := hp[0], hp[1]
		r, err := medianRun(rounds, h, p, 0)
		if err != nil {
			return c, err
		}
		logf("  %2d×%-2d cpu %8.2f ms  packets %d (%d B)  streams %d (%d B, largest %d)  attach %d B", h, p, ms(r.cpu), r.packets, r.packetBytes, r.streams, r.streamBytes, r.maxStream, r.attachBytes)
		n := float64(h * p)
		fpkts, fbytes = fpkts+r.packets, fbytes+r.packetBytes
		if h == 1 {
			xb = append(xb, []float64{float64(p - 1), float64((p - 1) * p)})
			ybytes = append(ybytes, float64(r.attachBytes))
		} else {
			xd = append(xd, []float64{1, float64(2 * h), float64(2 * h * (p - 1))})
			yd = append(yd, float64(r.maxStream))
		}
		if p == 4 && h > 1 {
			continue // the calibration's shape (H×4) stays out of the CPU fit
		}
		xs = append(xs, []float64{float64(h), float64(h * (p - 1)), n * n, float64(2 * r.streams), float64(r.streamBytes), float64(r.packets)})
		ycpu = append(ycpu, float64(r.cpu))
	}
	f := nnls(xs, ycpu)
	c.LeaderStart, c.Attach, c.TableEntry = positive(f[0]), positive(f[1]), positive(f[2])
	c.PushPull, c.StateByte = positive(f[3]), positive(f[4])
	fitByte := c.StateByte
	logf("  fit: LeaderStart %v  Attach %v  TableEntry %v  PushPull %v per end  StateByte %v per byte  formation packet %v (idle: %v)",
		c.LeaderStart, c.Attach, c.TableEntry, c.PushPull, c.StateByte, time.Duration(f[5]), c.Packet)
	src := "non-negative least squares of the real formations' process CPU over 1×{16..1024}, {4..32}×2, 8×16, 16×8, 16×16 and 32×8 (rendezvous.Join over in-memory networks, packets and stream bytes counted): LeaderStart·H + Attach·H(P−1) + TableEntry·N² + PushPull·2·streams + StateByte·bytes + p·packets (p fitted too, not used: the model charges the idle-measured Packet, the larger); a coefficient the fit sets to 0 is reported as 1 ns"
	c.Source["leader_start_ns,attach_ns,table_entry_ns,push_pull_ns,state_byte_ns"] = src
	b := leastSquares(xb, ybytes)
	c.TableEntryBytes = int(math.Max(1, math.Round(b[1])))
	c.Source["table_entry_bytes"] = "least squares of the attach streams' bytes over 1×{16..1024}: (P−1)·hello + (P−1)·P·entry"
	d := leastSquares(xd, yd)
	c.StateNodeBytes, c.StateRankBytes = int(math.Max(1, math.Round(d[1]))), int(math.Max(1, math.Round(d[2])))
	c.AliveBytes = c.StateNodeBytes
	// A formation packet carries gossip messages; its fitted cost, per
	// message it carries, is what applying one costs.
	c.GossipMsg = time.Nanosecond
	if fpkts > 0 {
		perPkt := float64(fbytes) / float64(fpkts) / float64(c.AliveBytes+2)
		c.GossipMsg = positive(f[5] / max(1, perPkt))
		logf("  GossipMsg %v: the fit's %v per formation packet ÷ %.1f messages per packet (%d packets, %d B)", c.GossipMsg, time.Duration(f[5]), perPkt, fpkts, fbytes)
	}
	c.Source["gossip_msg_ns"] = "the formation fit's cost per gossip packet (p above) divided by the messages a formation packet carries (its mean size ÷ an alive message's); noisy: 0 to 145 µs per packet across runs, hence the ×2 row"
	logf("  fit: state node %d B, state rank %d B (overhead %.0f B), table entry %d B", c.StateNodeBytes, c.StateRankBytes, d[0], c.TableEntryBytes)
	c.Source["state_node_bytes,state_rank_bytes"] = "least squares of the largest push-pull stream (the seed's push, both ways) over {4..32}×2, 8×16, 16×8, 16×16, 32×8 and 16×4"
	// The formation fit cannot tell push-pull bytes from gossip handling
	// (both grow with the hosts): memberlist's push-pull is measured on
	// its own, and the fit's figure kept only as a bound.
	var per, pkt []time.Duration
	for range rounds {
		pb, pp, st, err := measurePushPull(64, 200, 40)
		if err != nil {
			return c, err
		}
		per, pkt = append(per, pb), append(pkt, pp)
		logf("  memberlist, 64 members: push-pull %v per byte (state %d B each way), a packet in a burst %v", pb, st, pp)
	}
	sort.Slice(per, func(i, j int) bool { return per[i] < per[j] })
	sort.Slice(pkt, func(i, j int) bool { return pkt[i] < pkt[j] })
	alone := per[(len(per)-1)/2]
	// A push-pull at formation brings news that must be applied (new
	// members: aliveNode, NotifyJoin, the World's merge); memberlist's
	// push-pull of a known state does not. The model charges the formation
	// fit's figure, which includes applying news (calibration: the model's
	// CPU fell to 0.4 of the real code's at 32×4 with memberlist's alone).
	c.StateByte = max(fitByte, positive(float64(alone)))
	idlePacket := c.Packet
	c.Packet = positive(float64(pkt[(len(pkt)-1)/2]))
	logf("  Packet %v (a burst of SendBestEffort, median); idle CPU per packet was %v (members' timers included)", c.Packet, idlePacket)
	c.Source["packet_ns"] = fmt.Sprintf("real memberlist as below: CPU of 200 SendBestEffort to each of 64 members (both ends) beyond the same time idle, per packet, median of %d; the idle 16×2 world's CPU per packet, timers included, was %v", rounds, idlePacket)
	c.Source["ping_bytes"] = "a formed real 16×2 world idle for 3 s: bytes ÷ packets (probes: ping and ack)"
	logf("  StateByte %v (the formation fit, news applied); memberlist's push-pull of a known state alone: %v per byte", c.StateByte, alone)
	c.Source["state_byte_ns"] = fmt.Sprintf("the formation fit above (push-pulls that bring news, applied); real memberlist alone (rendezvous's encryption and label, 40 B of metadata, 64 members, 200 push-pulls of a known state beyond the same time idle ÷ 2 × bytes, median of %d) gave %v, a lower bound", rounds, alone)
	c.Source["alive_bytes"] = "taken as a push-pull node state's size (the same fields: name, address, metadata, incarnation)"

	if err := measureProcesses(&c, gorunBin, rss, rounds, logf); err != nil {
		return c, err
	}
	return c, nil
}

// measureProcesses measures what real processes cost (the launch's, the
// launcher's memory from rss, a rank process's start and idle timers),
// sets the PMI sizes taken from notes/scale.md; the caller validates c
// once the death costs are in (loadOrMeasure).
func measureProcesses(c *sim.Costs, gorunBin string, rss []rssPoint, rounds int, logf func(string, ...any)) error {
	if err := measureLaunch(c, gorunBin, logf); err != nil {
		return err
	}
	slope, base := fitRSS(rss)
	c.LauncherBytesPerRank, c.LauncherBase = int(math.Max(1, slope)), int(math.Max(1, base))
	c.Source["launcher_bytes_per_rank"] = fmt.Sprintf("slope of gorun's VmRSS (launcher + local agent) over -np at %v", rss)

	c.PMICardBytes, c.PMIReleaseBytes, c.PMIEnvelopeBytes = 100, 40, 70
	c.Source["pmi_*"] = "notes/scale.md: MPICH 4.0.2's cards (~90 hex digits and the key), a release carries the barrier's number in a JSON command (~40 B), a batched answer's envelope ~70 B"
	// The socket costs first: the process costs are what a real job
	// spends beyond everything else the model charges it, sockets included.
	if err := measureSocketCosts(c, 2*rounds+1, logf); err != nil {
		return err
	}
	if err := measureProcessCosts(c, gorunBin, 2*rounds+1, logf); err != nil {
		return err
	}
	// The stand-ins of the wake-up excess spend the idle CPU just
	// measured.
	return measureWake(c, rounds, rendezvous.DefaultConfig().GossipInterval, logf)
}

// measureProcessCosts sets c's ProcessStart and ProcessIdle from jobs real
// 1×2 jobs (measureProcess), and says so in c.Source.
func measureProcessCosts(c *sim.Costs, gorunBin string, jobs int, logf func(string, ...any)) error {
	var err error
	if c.ProcessStart, c.ProcessIdle, err = measureProcess(*c, gorunBin, jobs, 3*time.Second, logf); err != nil {
		return fmt.Errorf("process costs: %w", err)
	}
	c.Source["process_start_ns"] = fmt.Sprintf("real 1×2 jobs of the rank program (gorun -np 2 on this machine): a rank's CPU from main to formed, median of %d jobs (each the mean of its 2 ranks), less what the model charges per rank for that job otherwise", jobs)
	c.Source["process_idle_ns"] = fmt.Sprintf("the same jobs left formed and idle for 3 s: a rank's CPU per second over it, median of %d jobs (each the mean of its 2 ranks)", jobs)
	return nil
}

// measureLaunch measures a process start (the agent: gorun's binary; a
// rank: /bin/true) by the children's CPU time, and gorun's side of an agent
// hello (a loopback TCP accept and the HMAC handshake both ways).
func measureLaunch(c *sim.Costs, gorunBin string, logf func(string, ...any)) error {
	spawn := func(argv ...string) (time.Duration, error) {
		const n = 10
		before := childCPU()
		for range n {
			if err := exec.Command(argv[0], argv[1:]...).Run(); err != nil {
				return 0, fmt.Errorf("%v: %w", argv, err)
			}
		}
		return (childCPU() - before) / n, nil
	}
	var err error
	if c.AgentStart, err = spawn(gorunBin, "--version"); err != nil {
		return err
	}
	if c.RankSpawn, err = spawn("/bin/true"); err != nil {
		return err
	}
	c.AgentStart, c.RankSpawn = max(c.AgentStart, time.Microsecond), max(c.RankSpawn, time.Microsecond)
	if c.AgentHello, err = helloCost(); err != nil {
		return err
	}
	logf("  launch: agent start %v, rank spawn %v, hello %v", c.AgentStart, c.RankSpawn, c.AgentHello)
	c.Source["agent_start_ns,rank_spawn_ns"] = "children's CPU time of 10 runs of `gorun --version` and of /bin/true"
	c.Source["agent_hello_ns"] = "process CPU of a loopback TCP connect+accept and four HMAC-SHA-256 (challenge and proof both ways), 200 times"
	c.SSH, c.SSHWall = 290*time.Millisecond, 290*time.Millisecond
	c.Source["ssh_ns,ssh_wall_ns"] = "launcher/sshkex: `ssh host true` with curve25519-sha256 took 0.29 s on the test hosts; all of it taken as CPU, half at each end (an upper bound)"
	return nil
}

func helloCost() (time.Duration, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	const n = 200
	done := make(chan error, 1)
	go func() {
		for range n {
			conn, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			buf := make([]byte, 32)
			_, err = io.ReadFull(conn, buf)
			conn.Close()
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	c0 := cpuTime()
	for range n {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return 0, err
		}
		var sum []byte
		for range 4 {
			m := hmac.New(sha256.New, key)
			m.Write(sum)
			sum = m.Sum(nil)
		}
		_, err = conn.Write(sum)
		conn.Close()
		if err != nil {
			return 0, err
		}
	}
	if err := <-done; err != nil {
		return 0, err
	}
	return (cpuTime() - c0) / n, nil
}

// rssPoint is gorun's resident memory with np ranks.
type rssPoint struct{ np, kb int }

func (p rssPoint) String() string { return fmt.Sprintf("-np %d: %d KB", p.np, p.kb) }

// fitRSS returns the slope (bytes per rank) and intercept of RSS over -np.
func fitRSS(pts []rssPoint) (slope, base float64) {
	var xs [][]float64
	var ys []float64
	for _, p := range pts {
		xs = append(xs, []float64{1, float64(p.np)})
		ys = append(ys, float64(p.kb)*1024)
	}
	if len(xs) < 2 {
		return 0, 0
	}
	f := leastSquares(xs, ys)
	return f[1], f[0]
}

// leastSquares solves min ‖X·b − y‖ by the normal equations (a handful of
// parameters and points).
func leastSquares(x [][]float64, y []float64) []float64 {
	k := len(x[0])
	a := make([][]float64, k)
	for i := range a {
		a[i] = make([]float64, k+1)
	}
	for r, row := range x {
		for i := range k {
			for j := range k {
				a[i][j] += row[i] * row[j]
			}
			a[i][k] += row[i] * y[r]
		}
	}
	for col := range k { // Gauss-Jordan with partial pivoting
		p := col
		for r := col + 1; r < k; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[p][col]) {
				p = r
			}
		}
		a[col], a[p] = a[p], a[col]
		if a[col][col] == 0 {
			continue
		}
		for r := range k {
			if r != col {
				f := a[r][col] / a[col][col]
				for j := col; j <= k; j++ {
					a[r][j] -= f * a[col][j]
				}
			}
		}
	}
	out := make([]float64, k)
	for i := range k {
		if a[i][i] != 0 {
			out[i] = a[i][k] / a[i][i]
		}
	}
	return out
}

// nnls is least squares with every coefficient ≥ 0: a coefficient that
// comes out negative is fixed at 0 and the rest solved again.
func nnls(x [][]float64, y []float64) []float64 {
	k := len(x[0])
	active := make([]bool, k)
	for i := range active {
		active[i] = true
	}
	for {
		var idx []int
		for i, a := range active {
			if a {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 {
			return make([]float64, k)
		}
		sub := make([][]float64, len(x))
		for r, row := range x {
			for _, i := range idx {
				sub[r] = append(sub[r], row[i])
			}
		}
		sol := leastSquares(sub, y)
		worst, at := 0.0, -1
		for j, v := range sol {
			if v < worst {
				worst, at = v, idx[j]
			}
		}
		if at < 0 {
			out := make([]float64, k)
			for j, i := range idx {
				out[i] = sol[j]
			}
			return out
		}
		active[at] = false
	}
}

// positive is a fitted duration, at least 1 ns: a cost the fit makes
// negative (noise) is reported as the smallest positive one, never free
// and never negative.
func positive(v float64) time.Duration { return max(time.Nanosecond, time.Duration(v)) }

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// childCPU is the CPU time of this process's reaped children.
func childCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
