package comm

import "testing"

// eagerLink is a Link that only answers EagerLimit, for the algorithm
// choice, which reads nothing else of a link.
type eagerLink struct {
	Link
	eager int
}

func (l eagerLink) EagerLimit() int { return l.eager }

// allReduceRing picks the algorithm family from the size and whether the
// group crowds one host, as measured in notes/shm-latency.md;
// uncrowded groups keep the cost model.
func TestAllReduceAlgorithmChoice(t *testing.T) {
	const shmEager, tcpEager = 128 << 10, 16 << 10
	cases := []struct {
		name          string
		n             int
		eager         int // EagerLimit of the link to the peer (n = 2)
		crowded, det  bool
		size          int
		wantBandwidth bool
	}{
		{"2 shm small", 2, shmEager, false, false, 8, false},
		{"2 shm 64 KiB: pair", 2, shmEager, false, false, 64 << 10, true},
		{"2 shm 4 MiB: pair", 2, shmEager, false, false, 4 << 20, true},
		{"2 tcp 8 KiB: doubling", 2, tcpEager, false, false, 8 << 10, false},
		{"2 tcp 64 KiB: ring", 2, tcpEager, false, false, 64 << 10, true},
		{"4 crowded 16 KiB: doubling", 4, 0, true, false, 16 << 10, false},
		{"4 crowded 256 KiB: doubling", 4, 0, true, false, crowdedRingFrom, false},
		{"4 crowded 512 KiB: ring", 4, 0, true, false, 2 * crowdedRingFrom, true},
		{"7 crowded 64 KiB: doubling", 7, 0, true, false, 64 << 10, false},
		{"4 uncrowded 64 KiB: cost model's ring", 4, 0, false, false, 64 << 10, true},
		{"4 crowded deterministic 64 KiB: cost model", 4, 0, true, true, 64 << 10, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Deterministic = tc.det
			c := &Comm{cfg: cfg, n: tc.n, me: 0, crowded: tc.crowded, peers: make([]*peer, tc.n)}
			for r := 1; r < tc.n; r++ {
				c.peers[r] = &peer{rank: r, link: eagerLink{eager: tc.eager}}
			}
			if got := c.allReduceRing(tc.size); got != tc.wantBandwidth {
				t.Errorf("%d ranks, %d bytes: bandwidth-optimal %v, want %v", tc.n, tc.size, got, tc.wantBandwidth)
			}
		})
	}
}
