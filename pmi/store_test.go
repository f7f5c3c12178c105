package pmi

import (
	"bufio"
	"fmt"
	"maps"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStoreBatchesByHostAndBarrier: a get is answered with the other keys
// its host put in its barrier, once per reading host (a later get of that
// batch by the same host goes without its value, another host gets the
// batch again); a key of another host, a missing key and a key put again
// in a later barrier are answered by their own batch; a batch stops at
// BatchLimit and a key past the cut is answered with its value.
func TestStoreBatchesByHostAndBarrier(t *testing.T) {
	var st Store
	st.Fence(0, map[string]string{"a0": "x", "a1": "y"})
	st.Fence(0, map[string]string{"a2": "z"}) // a host's puts of one barrier, in two reports
	st.Fence(4, map[string]string{"b0": "p"})
	if a := st.Get(8, "a0"); a.Found {
		t.Fatalf("a key of an unreleased barrier was found: %+v", a)
	}
	st.Release()

	a := st.Get(8, "a1")
	if !a.Found || a.Batched || a.Value != "y" || !maps.Equal(a.More, map[string]string{"a0": "x", "a2": "z"}) {
		t.Errorf("first get of host 0's key by host 8: %+v, want y with a0 and a2", a)
	}
	if a := st.Get(8, "a2"); !a.Found || !a.Batched || a.More != nil {
		t.Errorf("second get of that batch by host 8: %+v, want Batched and no more", a)
	}
	if a := st.Get(12, "a2"); a.Batched || a.Value != "z" || !maps.Equal(a.More, map[string]string{"a0": "x", "a1": "y"}) {
		t.Errorf("host 12's first get of the batch: %+v, want z with a0 and a1", a)
	}
	if a := st.Get(8, "b0"); !a.Found || a.Batched || a.Value != "p" || a.More != nil {
		t.Errorf("host 4's only key: %+v, want p alone", a)
	}
	if a := st.Get(8, "nobody"); a.Found || a.More != nil {
		t.Errorf("a key nobody put: %+v", a)
	}

	st.Fence(0, map[string]string{"a1": "y2", "c": "w"})
	st.Release()
	if a := st.Get(8, "a1"); a.Batched || a.Value != "y2" || !maps.Equal(a.More, map[string]string{"c": "w"}) {
		t.Errorf("a key put again: %+v, want the later barrier's value and batch", a)
	}
	if a := st.Get(16, "a0"); !maps.Equal(a.More, map[string]string{"a2": "z"}) {
		t.Errorf("the first batch without its re-put key: %+v", a)
	}
	if st.Len() != 5 {
		t.Errorf("Len %d, want 5", st.Len())
	}

	var big Store
	puts := map[string]string{}
	for i := range 1000 {
		puts[fmt.Sprintf("k%03d", i)] = strings.Repeat("v", 200)
	}
	big.Fence(0, puts)
	big.Release()
	a = big.Get(1, "k000")
	n := 0
	for k, v := range a.More {
		n += len(k) + len(v)
	}
	if n > BatchLimit || len(a.More) == 0 || len(a.More) >= 999 {
		t.Errorf("batch of %d keys, %d bytes; want some, within %d", len(a.More), n, BatchLimit)
	}
	if a := big.Get(1, "k999"); a.Batched || a.Value == "" {
		t.Errorf("a key past the batch's cut: Batched %v, value of %d bytes; want its value", a.Batched, len(a.Value))
	}
	if a := big.Get(1, "k001"); !a.Batched || a.More != nil {
		t.Errorf("a key inside the cut: Batched %v, %d more keys; want Batched alone", a.Batched, len(a.More))
	}
}

// TestAnswerBatchAnswersWaitingRanks: a batch answer lets every rank
// waiting on one of its keys go, the host keeps the batch (a later get of
// it asks nobody), the Batched answer to a request the batch overtook is
// no error, and answers that cannot be right are refused: one for a key
// nobody asked for, and a Batched one for a key no batch brought, whose
// waiting rank is told the key is missing rather than left waiting.
func TestAnswerBatchAnswersWaitingRanks(t *testing.T) {
	s, err := NewServer(Config{KVSName: "k", Size: 8, Ranks: []int{0, 1}, Fetch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var serve sync.WaitGroup
	defer serve.Wait()
	clients := fencedPair(t, s, &serve)
	for _, c := range clients {
		defer c.c.Close()
	}
	var wg sync.WaitGroup

	got := make([]string, 2)
	for r, key := range []string{"card-4", "card-5"} {
		wg.Go(func() { got[r] = clients[r].do("cmd=get kvsname=k key=" + key) })
	}
	first, second := <-s.Requests(), <-s.Requests()
	if first.Kind != Get || second.Kind != Get || first.Key == second.Key {
		t.Fatalf("requests %+v and %+v, want gets of card-4 and card-5", first, second)
	}
	batch := map[string]string{"card-4": "addr4", "card-5": "addr5", "card-6": "addr6"}
	more := maps.Clone(batch)
	delete(more, first.Key)
	if err := s.AnswerBatch(first.Key, Answer{Value: batch[first.Key], Found: true, More: more}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for r, key := range []string{"card-4", "card-5"} {
		if want := "cmd=get_result rc=0 msg=success value=" + batch[key]; got[r] != want {
			t.Errorf("rank %d: %q, want %q", r, got[r], want)
		}
	}
	if err := s.AnswerBatch(second.Key, Answer{Found: true, Batched: true}); err != nil {
		t.Errorf("the Batched answer to a request the batch overtook: %v", err)
	}
	kept := make(chan string, 1)
	go func() { kept <- clients[0].do("cmd=get kvsname=k key=card-6") }()
	select {
	case g := <-kept:
		if !strings.HasSuffix(g, "value=addr6") {
			t.Errorf("a key the batch brought: %q", g)
		}
	case extra := <-s.Requests():
		t.Errorf("request %+v for a key the batch brought", extra)
		_ = s.AnswerBatch(extra.Key, Answer{Value: "addr6", Found: true})
		<-kept
	}

	if err := s.AnswerBatch("card-9", Answer{Found: true, Batched: true}); err == nil {
		t.Error("an answer nobody asked for was accepted")
	}
	wg.Go(func() { got[1] = clients[1].do("cmd=get kvsname=k key=card-7") })
	if req := <-s.Requests(); req.Key != "card-7" {
		t.Fatalf("request %+v, want a get of card-7", req)
	}
	if err := s.AnswerBatch("card-7", Answer{Found: true, Batched: true}); err == nil {
		t.Error("a Batched answer for a key no batch brought was accepted")
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the rank waiting on a wrongly Batched key was left waiting")
	}
	if !strings.Contains(got[1], "rc=-1") {
		t.Errorf("a wrongly Batched key: %q, want rc=-1 (missing)", got[1])
	}
}

// TestBatchedGetsFollowHostsRead: MPICH ch4's address exchange, as
// Debian's MPICH 4.0 runs it (bench/pmiscale -wire shows the wire): every
// rank puts its address, and after the barrier a host's ranks together
// read every rank's. With batches, the host asks the owner once per other
// host (plus one Batched reply per get that was already in flight), not
// once per key.
func TestBatchedGetsFollowHostsRead(t *testing.T) {
	const hosts, per = 16, 4
	for _, batched := range []bool{true, false} {
		gets := mpichExchange(t, hosts, per, batched)
		t.Logf("%d×%d, batches %v: %d gets reached the owner from the reading host", hosts, per, batched, gets)
		switch {
		case batched && gets > (hosts-1)+(hosts-1)*(per-1):
			t.Errorf("with batches: %d gets, want at most one per other host plus the gets in flight with it (%d)", gets, (hosts-1)*per)
		case batched && gets < hosts-1:
			t.Errorf("with batches: %d gets for %d other hosts", gets, hosts-1)
		case !batched && gets != (hosts-1)*per:
			t.Errorf("without batches: %d gets, want one per remote key (%d)", gets, (hosts-1)*per)
		}
	}
}

// mpichExchange runs one host's view of the exchange: host 0's server, the
// other hosts' puts given to the owner's Store directly, host 0's ranks
// reading all keys split among them (as MPICH's shared-memory allgather
// does), and an owner answering from the Store with or without its
// batches. It returns the gets host 0 sent the owner.
func mpichExchange(t *testing.T, hosts, per int, batched bool) int {
	t.Helper()
	size := hosts * per
	ranks := make([]int, per)
	for i := range ranks {
		ranks[i] = i
	}
	s, err := NewServer(Config{KVSName: "k", Size: size, Ranks: ranks, Fetch: true})
	if err != nil {
		t.Fatal(err)
	}
	var serve sync.WaitGroup
	defer serve.Wait()
	defer s.Close()
	var st Store
	for h := 1; h < hosts; h++ {
		puts := map[string]string{}
		for r := h * per; r < (h+1)*per; r++ {
			puts[fmt.Sprintf("-allgather-shm-1-%d", r)] = fmt.Sprintf("addr%d", r)
		}
		st.Fence(h*per, puts)
	}
	clients := make([]*client, per)
	for r := range per {
		a, b := net.Pipe()
		defer a.Close()
		serve.Go(func() { _ = s.ServeConn(r, b) })
		clients[r] = &client{t: t, c: a, br: bufio.NewReader(a)}
	}
	var wg sync.WaitGroup
	for r := range per {
		wg.Go(func() {
			clients[r].do("cmd=init pmi_version=1 pmi_subversion=1")
			clients[r].do(fmt.Sprintf("cmd=put kvsname=k key=-allgather-shm-1-%d value=addr%d", r, r))
			clients[r].do("cmd=barrier_in")
		})
	}
	fence := <-s.Requests()
	st.Fence(0, fence.Puts)
	st.Release()
	if err := s.Release(0, nil); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	gets := 0
	ownerDone := make(chan struct{})
	go func() {
		defer close(ownerDone)
		for req := range s.Requests() {
			if req.Kind != Get {
				continue
			}
			gets++
			a := st.Get(0, req.Key)
			if !batched {
				a.More, a.Batched = nil, false
			}
			if err := s.AnswerBatch(req.Key, a); err != nil {
				t.Error(err)
			}
		}
	}()
	for r := range per {
		wg.Go(func() {
			for q := r * size / per; q < (r+1)*size/per; q++ {
				got := clients[r].do(fmt.Sprintf("cmd=get kvsname=k key=-allgather-shm-1-%d", q))
				if want := fmt.Sprintf("value=addr%d", q); !strings.HasSuffix(got, want) {
					t.Errorf("rank %d: get of rank %d's address: %q", r, q, got)
				}
			}
		})
	}
	wg.Wait()
	s.Close()
	<-ownerDone
	return gets
}

// TestBatchFreedRanksAskAgain: a batch answer frees ranks whose own gets
// are still queued for the owner, and they ask again at once; the queue
// holds the stale gets and the new ones, so no rank is told a key is
// missing because the queue was full, and the owner's answers to the
// stale gets (Batched) and to the new ones reach everyone.
func TestBatchFreedRanksAskAgain(t *testing.T) {
	const per = 4
	ranks := []int{0, 1, 2, 3}
	s, err := NewServer(Config{KVSName: "k", Size: 16, Ranks: ranks, Fetch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var serve sync.WaitGroup
	defer serve.Wait()
	clients := make([]*client, per)
	for r := range per {
		a, b := net.Pipe()
		defer a.Close()
		serve.Go(func() { _ = s.ServeConn(r, b) })
		clients[r] = &client{t: t, c: a, br: bufio.NewReader(a)}
	}
	var wg sync.WaitGroup
	for r := range per {
		wg.Go(func() {
			clients[r].do("cmd=init pmi_version=1 pmi_subversion=1")
			clients[r].do("cmd=barrier_in")
		})
	}
	<-s.Requests()
	if err := s.Release(0, nil); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	// The owner's store: host 4 put keys a0..a3, host 8 keys b0..b3.
	var st Store
	for h, p := range map[int]string{4: "a", 8: "b"} {
		puts := map[string]string{}
		for i := range per {
			puts[fmt.Sprintf("%s%d", p, i)] = fmt.Sprintf("v-%s%d", p, i)
		}
		st.Fence(h, puts)
	}
	st.Release()

	got := make([][]string, per)
	asked := make(chan struct{}, 2*per)
	for r := range per {
		wg.Go(func() {
			for _, p := range []string{"a", "b"} {
				asked <- struct{}{}
				got[r] = append(got[r], clients[r].do(fmt.Sprintf("cmd=get kvsname=k key=%s%d", p, r)))
			}
		})
	}
	// Every rank's first get is queued before the owner answers any.
	for range per {
		<-asked
	}
	deadline := time.After(10 * time.Second)
	for len(s.Requests()) < per {
		select {
		case <-deadline:
			t.Fatalf("%d of %d first gets queued", len(s.Requests()), per)
		case <-time.After(time.Millisecond):
		}
	}
	answer := func(req Request) {
		if req.Kind != Get {
			t.Errorf("request %+v, want a get", req)
			return
		}
		if err := s.AnswerBatch(req.Key, st.Get(0, req.Key)); err != nil {
			t.Error(err)
		}
	}
	// The first answer carries host 4's batch: every rank is free and
	// asks for its b key while the other three a gets wait in the queue.
	answer(<-s.Requests())
	for range per {
		<-asked
	}
	// Then the stale a gets (Batched) and the b gets, until every rank
	// has both values (a b get may find host 8's batch already there).
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for finished := false; !finished; {
		select {
		case req := <-s.Requests():
			answer(req)
		case <-done:
			finished = true
		case <-deadline:
			t.Fatal("ranks still waiting for their gets after 10 s")
		}
	}
	for r := range per {
		want := []string{fmt.Sprintf("value=v-a%d", r), fmt.Sprintf("value=v-b%d", r)}
		if len(got[r]) != 2 || !strings.HasSuffix(got[r][0], want[0]) || !strings.HasSuffix(got[r][1], want[1]) {
			t.Errorf("rank %d: %q, want %v", r, got[r], want)
		}
	}
}
