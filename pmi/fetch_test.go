package pmi

import (
	"bufio"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestFetchAsksOwnerOncePerHost: with Config.Fetch, a get of a key the
// host does not hold becomes one Get request for the owner however many
// ranks ask at once, the answer reaches them all and is kept (no second
// request), a missing key is reported missing, an answer nobody asked for
// is refused, and Close lets a rank waiting on the owner go.
func TestFetchAsksOwnerOncePerHost(t *testing.T) {
	s, err := NewServer(Config{KVSName: "k", Size: 4, Ranks: []int{0, 1}, Fetch: true})
	if err != nil {
		t.Fatal(err)
	}
	var serve sync.WaitGroup
	clients := fencedPair(t, s, &serve)
	for _, c := range clients {
		defer c.c.Close()
	}
	var wg sync.WaitGroup

	got := make([]string, 2)
	for r := range 2 {
		wg.Go(func() { got[r] = clients[r].do("cmd=get kvsname=k key=card-3") })
	}
	req := <-s.Requests()
	if req.Kind != Get || req.Key != "card-3" {
		t.Fatalf("request %+v, want a Get of card-3", req)
	}
	// The second rank's get joins the first (give it time to arrive).
	time.Sleep(50 * time.Millisecond)
	select {
	case extra := <-s.Requests():
		t.Fatalf("second request %+v for a key already asked for", extra)
	default:
	}
	if err := s.Answer("card-3", "addr3", true); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for r, g := range got {
		if want := "cmd=get_result rc=0 msg=success value=addr3"; g != want {
			t.Errorf("rank %d: %q, want %q", r, g, want)
		}
	}
	kept := make(chan string, 1)
	wg.Go(func() { kept <- clients[0].do("cmd=get kvsname=k key=card-3") })
	select {
	case g := <-kept:
		if !strings.HasSuffix(g, "value=addr3") {
			t.Errorf("kept value: %q", g)
		}
	case extra := <-s.Requests():
		t.Errorf("request %+v for a key the host keeps", extra)
		_ = s.Answer(extra.Key, "addr3", true)
		<-kept
	}
	wg.Wait()
	if err := s.Answer("card-9", "x", true); err == nil {
		t.Error("an answer nobody asked for was accepted")
	}

	wg.Go(func() { got[0] = clients[0].do("cmd=get kvsname=k key=nobody") })
	if req := <-s.Requests(); req.Key != "nobody" {
		t.Fatalf("request %+v, want a Get of nobody", req)
	}
	if err := s.Answer("nobody", "", false); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if !strings.Contains(got[0], "rc=-1") {
		t.Errorf("missing key: %q, want rc=-1", got[0])
	}

	// A rank waiting on the owner when the server closes is let go.
	wg.Go(func() {
		_, _ = clients[1].c.Write([]byte("cmd=get kvsname=k key=late\n"))
	})
	if req := <-s.Requests(); req.Key != "late" {
		t.Fatalf("request %+v, want a Get of late", req)
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung on a rank waiting for the owner")
	}
	wg.Wait()
	serve.Wait()
}

// fencedPair connects PMI-1 clients for ranks 0 and 1 to s (served on
// serve; the caller closes the clients' ends) and takes them through init
// and one barrier, which it releases as gorun's owner would.
func fencedPair(t *testing.T, s *Server, serve *sync.WaitGroup) []*client {
	t.Helper()
	clients := make([]*client, 2)
	for r := range 2 {
		a, b := net.Pipe()
		serve.Go(func() { _ = s.ServeConn(r, b) })
		clients[r] = &client{t: t, c: a, br: bufio.NewReader(a)}
	}
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			clients[r].do("cmd=init pmi_version=1 pmi_subversion=1")
			clients[r].do("cmd=barrier_in")
		})
	}
	if req := <-s.Requests(); req.Kind != Fence {
		t.Fatalf("request %+v, want the fence", req)
	}
	if err := s.Release(0, nil); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	return clients
}
