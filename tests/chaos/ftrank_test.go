package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/ft"
)

// The rank program of the fault-tolerant rows (gorun --fault-tolerant, so
// GORUN_FT_ADDR is set): the replicas of package ft. Every iteration is
// one committed step: a quorum, then the small and the large all-reduce
// over its participants, each element checked against the sum the
// participants must give, then the commit vote. The victim's first
// incarnation kills itself at chaosPhase of iteration faultIter (small:
// before its call; large: 1 ms after issuing it, mid-transfer); its
// replacement heals (the state is the iteration count and the running
// sum of committed results) and the job completes. Every replica prints
// "chaos-result rank R iters N sum S longest MS ms": equal sums mean the
// replicas committed the same steps with the same results.
func runFTRank() int {
	me := envInt("RANK", -1)
	victim := envInt(chaosVictim, -1)
	inc := envInt(ft.IncarnationEnv, 0)
	armed := me == victim && inc == 0 && os.Getenv(chaosFault) == "kill"
	phase := strings.TrimPrefix(os.Getenv(chaosPhase), "ft-")
	ctx := context.Background()
	cfg := ft.DefaultConfig()
	m, err := ft.Join(ctx, cfg)
	if err != nil {
		fmt.Printf("chaos-error rank %d: join: %v\n", me, err)
		return 6
	}
	defer m.Close()
	// The state a heal copies: committed iterations and the sum.
	var st struct {
		iters int64
		sum   float64
	}
	m.SetState(ft.StateFuncs{
		SaveFunc: func() ([]byte, error) {
			b := binary.LittleEndian.AppendUint64(nil, uint64(st.iters))
			return binary.LittleEndian.AppendUint64(b, math.Float64bits(st.sum)), nil
		},
		LoadFunc: func(b []byte) error {
			if len(b) != 16 {
				return fmt.Errorf("state of %d bytes", len(b))
			}
			st.iters = int64(binary.LittleEndian.Uint64(b))
			st.sum = math.Float64frombits(binary.LittleEndian.Uint64(b[8:]))
			return nil
		},
	})
	small := make([]float64, 1)
	large := make([]float64, 1<<17)
	var longest time.Duration
	// A count of committed steps, not a time, and only with every replica
	// taking part: the replicas must stop at the same step, the
	// replacement starts later, and the row wants it back (a replacement
	// that never joins holds the row to its time bound).
	whole := false
	np := envInt("WORLD_SIZE", 0)
	if os.Getenv(chaosFault) == "kill-host" {
		// A lost host's rank (one per host in these rows) is retired,
		// not replaced: the others are the whole job from then on.
		np--
	}
	for st.iters < ftIters || !whole {
		t0 := time.Now()
		q, err := m.Quorum(ctx)
		if errors.Is(err, ft.ErrFinished) {
			break
		}
		if err != nil {
			fmt.Printf("chaos-error rank %d: quorum: %v\n", me, err)
			return 6
		}
		it := st.iters
		base := float64(it)
		c := m.Comm()
		n := float64(q.Size())
		var ids float64
		for _, p := range q.Participants {
			ids += float64(p.Replica)
		}
		fill := func(b []float64) {
			for i := range b {
				b[i] = float64(me) + base + float64(i%7)
			}
		}
		check := func(what string, got []float64) bool {
			for i, v := range got {
				if want := ids + n*(base+float64(i%7)); v != want {
					fmt.Printf("chaos-error rank %d: WRONG RESULT in %s: element %d = %v, want %v\n", me, what, i, v, want)
					return false
				}
			}
			return true
		}
		if armed && it == faultIter && phase == "small" {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		fill(small)
		ok := true
		if err := c.AllReduce(ctx, comm.Float64s(small), comm.Float64s(small), comm.Sum).Wait(ctx); err != nil {
			m.ReportError(err)
			ok = false
		} else {
			ok = check("small", small)
		}
		fill(large)
		h := c.AllReduce(ctx, comm.Float64s(large), comm.Float64s(large), comm.Sum)
		if armed && it == faultIter && phase == "large" {
			time.Sleep(time.Millisecond)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		if err := h.Wait(ctx); err != nil {
			m.ReportError(err)
		} else if ok && !check("large", large) {
			return 6
		}
		committed, err := m.ShouldCommit(ctx)
		if err != nil {
			fmt.Printf("chaos-error rank %d: commit: %v\n", me, err)
			return 6
		}
		if committed {
			st.iters++
			st.sum += large[len(large)-1]
			whole = q.Size() == np
		}
		longest = max(longest, time.Since(t0))
	}
	if err := m.Close(); err != nil {
		fmt.Printf("chaos-error rank %d: close: %v\n", me, err)
		return 6
	}
	fmt.Printf("chaos-result rank %d iters %d sum %v longest %d ms\n", me, st.iters, st.sum, longest.Milliseconds())
	return 0
}

// ftIters is how many steps a fault-tolerant row commits at least (then
// until a step every replica took part in).
const ftIters = 100

// equalResults checks that every replica of a fault-tolerant row ended
// with the same committed iterations and sum.
func equalResults(out string) []string {
	ms := regexp.MustCompile(`(?m)^chaos-result rank (\d+) iters (\d+) sum (\S+) `).FindAllStringSubmatch(out, -1)
	var bad []string
	for _, m := range ms {
		if m[2] != ms[0][2] || m[3] != ms[0][3] {
			bad = append(bad, fmt.Sprintf("rank %s ended with %s iterations, sum %s; rank %s with %s, %s: the replicas differ", m[1], m[2], m[3], ms[0][1], ms[0][2], ms[0][3]))
		}
	}
	if n, _ := strconv.Atoi(firstField(ms)); len(ms) > 0 && n < ftIters {
		bad = append(bad, fmt.Sprintf("only %d iterations committed", n))
	}
	return bad
}

// survivedLostHost is equalResults plus gorun's summary: one host lost,
// its rank retired, the survivors' next quorum without it, no heal.
func survivedLostHost(out string) []string {
	bad := equalResults(out)
	if !regexp.MustCompile(`(?m)^gorun: fault-tolerant: 1 failure .* 0 heals$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^gorun:   host \S+ lost at .*, [01] uncommitted: survivors continue; retired ranks \[2\]; the next quorum's participants \[0 1\]$`).MatchString(out) {
		bad = append(bad, "gorun's summary does not show the host lost, rank 2 retired and the survivors going on as [0 1]")
	}
	return bad
}

// healedOnce is equalResults plus gorun's summary: one failure, its rank
// replaced and healed.
func healedOnce(out string) []string {
	bad := equalResults(out)
	if !regexp.MustCompile(`(?m)^gorun: fault-tolerant: 1 failure .* 1 heal$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^gorun:   rank \d+ .*: replaced, .*, healed `).MatchString(out) {
		bad = append(bad, "gorun's summary does not show one failure replaced and healed")
	}
	return bad
}

func firstField(ms [][]string) string {
	if len(ms) == 0 {
		return "0"
	}
	return ms[0][2]
}
