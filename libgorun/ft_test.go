//go:build cgo

package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/ft"
	"github.com/gorun-hpc/gorun/rankenv"
)

func TestParseFTSettings(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ftSettings
		err  string // substring of the error; "" for none
	}{
		{in: "", want: ftSettings{}},
		{in: "dial_timeout_ms=1500 connect_timeout_ms=20 tcp=1 env.A=x:1",
			want: ftSettings{dial: 1500 * time.Millisecond, connect: 20 * time.Millisecond, tcp: true, env: map[string]string{"A": "x:1"}}},
		{in: "dial_timeout_ms=0", err: "dial_timeout_ms"},
		{in: "connect_timeout_ms=soon", err: "connect_timeout_ms"},
		{in: "tcp=maybe", err: `tcp="maybe"`},
		{in: "deterministic=1", err: `unknown key "deterministic"`},
		{in: "novalue", err: "want key=value"},
		{in: "env.=1", err: "env.NAME=VALUE"},
	} {
		got, err := parseFTSettings(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errInvalid) {
				t.Errorf("parseFTSettings(%q) = %v, want an invalid-argument error containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got.dial != tc.want.dial || got.connect != tc.want.connect || got.tcp != tc.want.tcp ||
			fmt.Sprint(got.env) != fmt.Sprint(orEmpty(tc.want.env)) {
			t.Errorf("parseFTSettings(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// Each of ft's failures maps to the status gorun.h promises for it.
func TestFTErrStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("gorun_ft_quorum: %w", ft.ErrQuorumFailed), statusPeerLost},
		{fmt.Errorf("gorun_ft_allreduce: %w: %w", ft.ErrQuorumFailed, comm.ErrPeerLost), statusPeerLost},
		{ft.ErrServiceLost, statusPeerLost},
		{fmt.Errorf("x: %w: the state's load callback returned 1", ft.ErrHeal), statusAborted},
		{ft.ErrNotFaultTolerant, statusInit},
		{ft.ErrAuth, statusInit},
		{ft.ErrPhase, statusInvalid},
		{ft.ErrNoState, statusInvalid},
		{ft.ErrClosed, statusClosed},
		{fmt.Errorf("gorun_ft_quorum: %w (they committed 9 steps)", ft.ErrFinished), statusClosed},
		{fmt.Errorf("gorun_ft_should_commit: %w", context.DeadlineExceeded), statusTimeout},
	} {
		if got := int(ftErr(tc.err)); got != tc.want {
			t.Errorf("ftErr(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// A stale or unknown handle, and calls with NULL outputs, are refused with
// GORUN_ERR_INVALID before anything reaches ft.
func TestFTBadHandles(t *testing.T) {
	if rc := gorun_ft_step(12345, nil); rc != statusInvalid {
		t.Errorf("gorun_ft_step(unknown) = %d, want %d", rc, statusInvalid)
	}
	if rc := gorun_ft_close(12345); rc != statusInvalid {
		t.Errorf("gorun_ft_close(unknown) = %d, want %d", rc, statusInvalid)
	}
	if rc := gorun_ft_join(nil, nil); rc != statusInvalid {
		t.Errorf("gorun_ft_join(out NULL) = %d, want %d", rc, statusInvalid)
	}
	if rc := gorun_ft_allreduce(12345, nil, 0, 1, 5, -1); rc != statusInvalid {
		t.Errorf("gorun_ft_allreduce(unknown) = %d, want %d", rc, statusInvalid)
	}
}

// A program that gorun did not start with --fault-tolerant is told so
// (GORUN_ERR_INIT), not left waiting.
func TestFTJoinOutsideGorun(t *testing.T) {
	t.Setenv(ft.AddrEnv, "") // restored after the test
	os.Unsetenv(ft.AddrEnv)
	var h int64
	rc := gorun_ft_join(nil, (*_Ctype_gorun_ft_t)(&h))
	if rc != statusInit {
		t.Fatalf("gorun_ft_join without %s = %d, want GORUN_ERR_INIT (%d)", ft.AddrEnv, rc, statusInit)
	}
}

// One replica through the C calls against an in-process quorum service:
// a quorum of one, an average and a bf16 sum over it, a commit that
// advances the step, the quorum's communicator as a handle the library's
// other calls take (and refused once the replica has closed).
func TestFTOneReplica(t *testing.T) {
	secret := strings.Repeat("ab", 32)
	sec, _ := hex.DecodeString(secret)
	s, err := ft.NewServer(ft.ServerConfig{Addr: "127.0.0.1:0", JobID: "ftabi", Secret: sec, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cfg := fmt.Sprintf("tcp=1 env.%s=0 env.%s=1 env.%s=ftabi env.%s=%s env.%s=localhost env.%s=%s env.%s=0",
		rankenv.GorunRank, rankenv.GorunWorldSize, rankenv.JobID, rankenv.Secret, secret, rankenv.GorunHost,
		ft.AddrEnv, s.Addr(), ft.IncarnationEnv)
	cb := []byte(cfg + "\x00") // read as a C string during the call
	ccfg := (*_Ctype_char)(unsafe.Pointer(&cb[0]))
	var h _Ctype_gorun_ft_t
	if rc := gorun_ft_join(ccfg, &h); rc != statusOK {
		t.Fatalf("gorun_ft_join = %d", rc)
	}
	var rep, reps, inc _Ctype_int
	if rc := gorun_ft_info(h, &rep, &reps, &inc); rc != statusOK || rep != 0 || reps != 1 || inc != 0 {
		t.Fatalf("gorun_ft_info = %d: replica %d of %d, incarnation %d", rc, rep, reps, inc)
	}
	var c _Ctype_gorun_comm_t
	if rc := gorun_ft_comm(h, &c); rc != statusInvalid {
		t.Errorf("gorun_ft_comm before a quorum = %d, want GORUN_ERR_INVALID", rc)
	}
	var gs, gi _Ctype_int
	if rc := gorun_ft_group(h, &gs, &gi); rc != statusOK || gs != 1 || gi != 0 {
		t.Errorf("gorun_ft_group without groups = %d: size %d, index %d; want 1, 0", rc, gs, gi)
	}
	var info _Ctype_gorun_ft_quorum_info
	parts := make([]_Ctype_int, 1)
	if rc := gorun_ft_quorum(h, 10000, &info, &parts[0], 1); rc != statusOK {
		t.Fatalf("gorun_ft_quorum = %d", rc)
	}
	if info.size != 1 || info.rank != 0 || info.step != 0 || info.healed != 0 || parts[0] != 0 {
		t.Fatalf("quorum %+v, participants %v", info, parts)
	}
	f32 := []float32{2, 4}
	if rc := gorun_ft_allreduce(h, unsafe.Pointer(&f32[0]), 2, 1 /* float32 */, 5 /* avg */, 10000); rc != statusOK || f32[0] != 2 || f32[1] != 4 {
		t.Errorf("float32 average over one = %d %v", rc, f32)
	}
	bf := []uint16{uint16(comm.BF16(3))}
	if rc := gorun_ft_allreduce(h, unsafe.Pointer(&bf[0]), 1, 3 /* bfloat16 */, 1 /* sum */, 10000); rc != statusOK || bf[0] != uint16(comm.BF16(3)) {
		t.Errorf("bfloat16 sum over one = %d %x", rc, bf[0])
	}
	if rc := gorun_ft_allreduce(h, unsafe.Pointer(&f32[0]), 2, 1, 4 /* max */, 10000); rc != statusInvalid {
		t.Errorf("gorun_ft_allreduce with max = %d, want GORUN_ERR_INVALID", rc)
	}
	if rc := gorun_ft_comm(h, &c); rc != statusOK {
		t.Fatalf("gorun_ft_comm = %d", rc)
	}
	var size _Ctype_int
	if rc := gorun_comm_size(c, &size); rc != statusOK || size != 1 {
		t.Errorf("gorun_comm_size(quorum communicator) = %d, size %d", rc, size)
	}
	var gc _Ctype_gorun_comm_t
	if rc := gorun_ft_group_comm(h, &gc); rc != statusInvalid {
		t.Errorf("gorun_ft_group_comm without groups = %d, want GORUN_ERR_INVALID", rc)
	}
	var commit _Ctype_int
	if rc := gorun_ft_should_commit(h, 10000, &commit); rc != statusOK || commit != 1 {
		t.Fatalf("gorun_ft_should_commit = %d, commit %d", rc, commit)
	}
	var step _Ctype_int64_t
	if rc := gorun_ft_step(h, &step); rc != statusOK || step != 1 {
		t.Errorf("gorun_ft_step = %d, step %d; want 1 after one commit", rc, step)
	}
	if rc := gorun_ft_close(h); rc != statusOK {
		t.Errorf("gorun_ft_close = %d", rc)
	}
	if rc := gorun_comm_size(c, &size); rc == statusOK {
		t.Error("the quorum communicator's handle outlived gorun_ft_close")
	}
	if rc := gorun_ft_close(h); rc != statusInvalid {
		t.Errorf("gorun_ft_close twice = %d, want GORUN_ERR_INVALID", rc)
	}
}

// Replica groups through the C calls: two groups of two ranks (four
// handles in this process, one per rank, against an in-process quorum
// service). Each rank learns its group size and place, gets its group's
// communicator as a handle, all-gathers and reduce-scatters over it (only
// its group's values come back), and all-reduces over the quorum, which
// is the ranks at its place in both groups. The group handle is refused
// after gorun_ft_close.
func TestFTReplicaGroups(t *testing.T) {
	const n, gsize = 4, 2
	secret := strings.Repeat("cd", 32)
	sec, _ := hex.DecodeString(secret)
	s, err := ft.NewServer(ft.ServerConfig{Addr: "127.0.0.1:0", JobID: "ftgrp", Secret: sec, Replicas: n, GroupSize: gsize})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hs := make([]_Ctype_gorun_ft_t, n)
	for r := range n {
		cfg := fmt.Sprintf("tcp=1 env.%s=%d env.%s=%d env.%s=ftgrp env.%s=%s env.%s=localhost env.%s=%s env.%s=0 env.%s=%d",
			rankenv.GorunRank, r, rankenv.GorunWorldSize, n, rankenv.JobID, rankenv.Secret, secret, rankenv.GorunHost,
			ft.AddrEnv, s.Addr(), ft.IncarnationEnv, ft.GroupSizeEnv, gsize)
		cb := []byte(cfg + "\x00")
		if rc := gorun_ft_join((*_Ctype_char)(unsafe.Pointer(&cb[0])), &hs[r]); rc != statusOK {
			t.Fatalf("rank %d: gorun_ft_join = %d", r, rc)
		}
	}
	errs := make(chan error, n)
	gcs := make([]_Ctype_gorun_comm_t, n)
	for r := range n {
		go func() {
			errs <- func() error {
				h := hs[r]
				var size, index _Ctype_int
				if rc := gorun_ft_group(h, &size, &index); rc != statusOK || size != gsize || int(index) != r%gsize {
					return fmt.Errorf("rank %d: gorun_ft_group = %d: size %d, index %d", r, rc, size, index)
				}
				var gc _Ctype_gorun_comm_t
				if rc := gorun_ft_group_comm(h, &gc); rc != statusInvalid {
					return fmt.Errorf("rank %d: gorun_ft_group_comm before a quorum = %d, want GORUN_ERR_INVALID", r, rc)
				}
				var info _Ctype_gorun_ft_quorum_info
				parts := make([]_Ctype_int, n)
				if rc := gorun_ft_quorum(h, 20000, &info, &parts[0], n); rc != statusOK {
					return fmt.Errorf("rank %d: gorun_ft_quorum = %d", r, rc)
				}
				// The participants: the ranks at this place in each group.
				if info.size != n/gsize || int(parts[0]) != r%gsize || int(parts[1]) != r%gsize+gsize {
					return fmt.Errorf("rank %d: quorum %+v, participants %v", r, info, parts[:info.size])
				}
				if rc := gorun_ft_group_comm(h, &gc); rc != statusOK {
					return fmt.Errorf("rank %d: gorun_ft_group_comm = %d", r, rc)
				}
				gcs[r] = gc
				var grank, gsz _Ctype_int
				if gorun_comm_rank(gc, &grank) != statusOK || gorun_comm_size(gc, &gsz) != statusOK || int(grank) != r%gsize || gsz != gsize {
					return fmt.Errorf("rank %d: group communicator rank %d of %d", r, grank, gsz)
				}
				send := []float32{float32(r)}
				got := make([]float32, gsize)
				if rc := gorun_allgather(gc, unsafe.Pointer(&send[0]), unsafe.Pointer(&got[0]), 1, 1, nil); rc != statusOK {
					return fmt.Errorf("rank %d: allgather over the group = %d", r, rc)
				}
				first := float32(r - r%gsize)
				if got[0] != first || got[1] != first+1 {
					return fmt.Errorf("rank %d: allgather over the group = %v, want [%v %v]", r, got, first, first+1)
				}
				full := []float32{float32(r), float32(10 * r)}
				var mine [1]float32
				if rc := gorun_reduce_scatter(gc, unsafe.Pointer(&full[0]), unsafe.Pointer(&mine[0]), 1, 1, 1 /* sum */, nil); rc != statusOK {
					return fmt.Errorf("rank %d: reduce_scatter over the group = %d", r, rc)
				}
				if want := float32((2*first + 1) * []float32{1, 10}[r%gsize]); mine[0] != want {
					return fmt.Errorf("rank %d: reduce_scatter over the group = %v, want %v", r, mine[0], want)
				}
				x := []float32{float32(r)}
				if rc := gorun_ft_allreduce(h, unsafe.Pointer(&x[0]), 1, 1, 1 /* sum */, 20000); rc != statusOK {
					return fmt.Errorf("rank %d: gorun_ft_allreduce = %d", r, rc)
				}
				if want := float32(2*(r%gsize) + gsize); x[0] != want {
					return fmt.Errorf("rank %d: sum across the groups = %v, want %v", r, x[0], want)
				}
				var commit _Ctype_int
				if rc := gorun_ft_should_commit(h, 20000, &commit); rc != statusOK || commit != 1 {
					return fmt.Errorf("rank %d: gorun_ft_should_commit = %d, commit %d", r, rc, commit)
				}
				return nil
			}()
		}()
	}
	// A rank that fails leaves the others blocked in a collective (no
	// timeout of their own): fail the test rather than hang it.
	deadline := time.After(60 * time.Second)
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-deadline:
			t.Fatal("the ranks did not finish in 60 s (a rank's failure leaves the others blocked)")
		}
	}
	for r := range n {
		if rc := gorun_ft_close(hs[r]); rc != statusOK {
			t.Errorf("rank %d: gorun_ft_close = %d", r, rc)
		}
		var size _Ctype_int
		if gcs[r] != 0 && gorun_comm_size(gcs[r], &size) == statusOK {
			t.Errorf("rank %d: the group communicator's handle outlived gorun_ft_close", r)
		}
	}
}
