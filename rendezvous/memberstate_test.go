package rendezvous

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"unsafe"
)

// Every rank holds one memberState per member of the world: N² of them
// when a world runs in one process (bench/rdzvscale), 4,096² × 144 bytes
// = 2.4 GB before the job id, size and generation moved out of it.
func TestMemberStateSize(t *testing.T) {
	if got := unsafe.Sizeof(memberState{}); got > 64 {
		t.Errorf("memberState is %d bytes; it is paid N² times in one process, keep it at 64 or less", got)
	}
}

// A Member read back from the compact table is the Member stored, with
// this world's job, size and generation, and an Addr saying where the
// rank is.
func TestMemberRebuilt(t *testing.T) {
	cfg := DefaultConfig()
	cfg.JobID, cfg.WorldSize, cfg.LocalWorldSize, cfg.Host, cfg.Generation = "compact", 4, 2, "h0", 3
	cfg.Secret = []byte("0123456789abcdef0123456789abcdef")
	w := newWorld(cfg)
	m := Member{Rank: 3, WorldSize: 4, LocalRank: 1, JobID: "compact", Generation: 3, Host: "h1", DataAddr: "10.0.0.2:9000", PID: 4242}
	w.mu.Lock()
	w.setMemberLocked(m, 2)
	got := w.memberLocked(3)
	w.mu.Unlock()
	want := m
	want.Addr = "attached to rank 2 (pid 4242)"
	if got != want {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// The member table keeps only this world's job, size and generation, so a
// world table entry of another is refused, naming it, not stored as this
// world's.
func TestTableForeignEntryRefused(t *testing.T) {
	cfg := DefaultConfig()
	cfg.JobID, cfg.WorldSize, cfg.LocalWorldSize, cfg.Host = "tbl", 2, 2, "h0"
	cfg.Rank, cfg.LocalRank = 1, 1
	cfg.Secret = []byte("0123456789abcdef0123456789abcdef")
	for _, tc := range []struct {
		name  string
		entry Member
		want  string
	}{
		{"job", Member{Rank: 0, WorldSize: 2, JobID: "other", Host: "h0"}, `job "other"`},
		{"generation", Member{Rank: 0, WorldSize: 2, JobID: "tbl", Host: "h0", Generation: 7}, "generation 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(cfg)
			body := binary.AppendUvarint(nil, 1) // epoch
			body = binary.AppendUvarint(body, 2)
			body = appendTableEntry(body, tc.entry, 0)
			body = appendTableEntry(body, cfg.meta(), 0)
			w.applyTable(body)
			w.mu.Lock()
			err, formed := w.fatal, w.formed
			w.mu.Unlock()
			if err == nil || formed || !strings.Contains(err.Error(), "rank 0") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("formed %v, error %v; want formation failed naming rank 0 and %s", formed, err, tc.want)
			}
		})
	}
}

// Rank, size, local rank and pid are stored in 32 bits: metadata with a
// larger one is refused, not truncated.
func TestMetaRefusesWideNumbers(t *testing.T) {
	m := Member{Rank: 1, WorldSize: 2, JobID: "j", Host: "h", PID: math.MaxInt32}
	if _, err := decodeMeta(encodeMeta(m)); err != nil {
		t.Fatalf("pid 2^31-1: %v", err)
	}
	m.PID = math.MaxInt32 + 1
	if _, err := decodeMeta(encodeMeta(m)); !errors.Is(err, errBadMeta) {
		t.Errorf("pid 2^31: %v, want errBadMeta", err)
	}
}
