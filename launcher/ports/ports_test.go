package ports

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestQuietRange(t *testing.T) {
	for _, tc := range []struct {
		in     string
		lo, hi int
		ok     bool
	}{
		{"32768\t60999\n", 10000, 32767, true},
		{"15000 60999", 10000, 14999, true},
		{"11000 60999", 0, 0, false}, // fewer than 1024 quiet ports
		{"1024 65535", 0, 0, false},
		{"", 0, 0, false},
		{"x 60999", 0, 0, false},
	} {
		lo, hi, ok := quietRange(tc.in)
		if lo != tc.lo || hi != tc.hi || ok != tc.ok {
			t.Errorf("quietRange(%q) = %d, %d, %v; want %d, %d, %v", tc.in, lo, hi, ok, tc.lo, tc.hi, tc.ok)
		}
	}
}

// Reserved ports lie below the ephemeral range when the machine leaves room
// there, so no outgoing connection can take them once released.
func TestReserveOutsideEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skipf("no ip_local_port_range: %v", err)
	}
	eph, _ := strconv.Atoi(strings.Fields(string(b))[0])
	if _, _, ok := quietRange(string(b)); !ok {
		t.Skipf("ephemeral range %q leaves no quiet ports", strings.TrimSpace(string(b)))
	}
	var held []*Reservation
	defer func() {
		for _, r := range held {
			r.Release()
		}
	}()
	seen := map[int]bool{}
	for range 8 {
		r, err := Reserve()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
		for _, p := range []int{r.MasterPort, r.RdzvPort} {
			if p < lowestQuietPort || p >= eph {
				t.Fatalf("port %d outside [%d, %d)", p, lowestQuietPort, eph)
			}
			if seen[p] {
				t.Fatalf("port %d handed out twice while reserved", p)
			}
			seen[p] = true
		}
	}
}

// Two reservations held at once never share a port, and Release may be
// called twice.
func TestReserveTwice(t *testing.T) {
	a, err := Reserve()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Reserve()
	if err != nil {
		t.Fatal(err)
	}
	ports := []int{a.MasterPort, a.RdzvPort, b.MasterPort, b.RdzvPort}
	slices.Sort(ports)
	if len(slices.Compact(ports)) != 4 {
		t.Fatalf("two reservations held at once share a port: %+v %+v", a, b)
	}
	a.Release()
	a.Release() // idempotent
	b.Release()
}
