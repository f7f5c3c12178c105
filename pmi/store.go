package pmi

import (
	"fmt"
	"maps"
	"slices"
)

// Store is the owner's side of Config.Fetch: the puts of every released
// barrier, each kept with the host that put it, and the answers to the
// hosts' gets.
//
// A get is answered in a batch: the key's value, and with it every other
// key that the same host put in the same barrier (up to BatchLimit bytes).
// An MPI library reads keys by host: MPICH's ch4 reads every rank's
// business card after its first barrier, and a rank's card and those of
// the ranks beside it on its host were put together. Fetching one key per
// round trip, a host leader of a 1,000 × 8 job makes 8,000 sequential
// round trips to gorun; in batches, one per host it reads from. What a
// batch carries is bounded by what one host put in one barrier, so a host
// still receives O(ranks per host) bytes per host it reads from, never
// the whole job's keys.
//
// A Store is not safe for concurrent use: its owner (gorun's event loop)
// calls it from one goroutine.
type Store struct {
	// open holds the open barrier's puts by host until Release.
	open map[int]map[string]string
	// vals holds every released key: its value and its batch (an index
	// into batches: the keys one host put in one barrier).
	vals    map[string]storeVal
	batches []storeBatch
	// sent records the batches each host was sent: a host's ranks ask
	// for keys of one batch at the same moment, and every request after
	// the first finds the batch sent and gets its key alone.
	sent map[int]map[int]struct{}
}

type storeVal struct {
	value string
	batch int // index into batches
	idx   int // index in its batch's keys
}

// storeBatch is the keys one host put in one barrier, sorted; an answer
// carries those before cut (their keys and values within BatchLimit).
type storeBatch struct {
	keys []string
	cut  int
}

// BatchLimit bounds the keys and values a batch answer carries (their
// lengths summed); the rest of that host's keys are fetched one by one
// when read. It keeps an answer well inside a wire frame however many keys
// a host put.
const BatchLimit = 64 << 10

// Fence records host's puts for the open barrier (the Puts of its Fence
// request); they are readable after Release. A host is named by any
// number that is the same for all its fences (gorun uses its lowest rank).
func (st *Store) Fence(host int, puts map[string]string) {
	if len(puts) == 0 {
		return
	}
	if st.open == nil {
		st.open = map[int]map[string]string{}
	}
	m := st.open[host]
	if m == nil {
		m = map[string]string{}
		st.open[host] = m
	}
	for k, v := range puts {
		m[k] = v
	}
}

// Release makes the open barrier's puts readable. A key put again (by
// the same host, or, which MPICH never does, by another) takes the later
// barrier's value and batch.
func (st *Store) Release() {
	if st.vals == nil {
		st.vals = map[string]storeVal{}
	}
	for _, puts := range st.open {
		b := storeBatch{keys: slices.Sorted(maps.Keys(puts))}
		n := 0
		for _, k := range b.keys {
			if n += len(k) + len(puts[k]); n > BatchLimit {
				break
			}
			b.cut++
		}
		for i, k := range b.keys {
			st.vals[k] = storeVal{value: puts[k], batch: len(st.batches), idx: i}
		}
		st.batches = append(st.batches, b)
	}
	st.open = nil
}

// Answer is the owner's answer to a host's get (Store.Get): the value,
// or Batched when the host was sent it in a batch before; More is the
// batch that comes with it. Apply it with Server.AnswerBatch.
type Answer struct {
	Value   string
	Found   bool
	Batched bool
	More    map[string]string
}

// Get answers host's get of key. The first get of a key of a batch by a
// host carries the batch: the other keys that the key's host put in its
// barrier (the first BatchLimit bytes of them; More is nil when there are
// none). A later get of a key that batch carried is answered Batched: the
// host holds the value, or its answer is on the way, since answers reach
// a host in order. The map is the caller's.
func (st *Store) Get(host int, key string) Answer {
	v, ok := st.vals[key]
	if !ok {
		return Answer{}
	}
	b := &st.batches[v.batch]
	if st.sent == nil {
		st.sent = map[int]map[int]struct{}{}
	}
	sent := st.sent[host]
	if sent == nil {
		sent = map[int]struct{}{}
		st.sent[host] = sent
	}
	if _, done := sent[v.batch]; done {
		return Answer{Value: v.value, Found: true, Batched: v.idx < b.cut}
	}
	sent[v.batch] = struct{}{}
	a := Answer{Value: v.value, Found: true}
	for _, k := range b.keys[:b.cut] {
		if o := st.vals[k]; k != key && o.batch == v.batch {
			if a.More == nil {
				a.More = map[string]string{}
			}
			a.More[k] = o.value
		}
	}
	return a
}

// Len returns the number of released keys.
func (st *Store) Len() int { return len(st.vals) }

// AnswerBatch applies the owner's Answer to a Get for key (Store.Get):
// key's value (a Batched answer is found whatever its Found), and a.More, other keys and values the host's ranks will
// likely read next, kept like a found key's value; a rank waiting on one
// of those is answered at once. A Batched answer carries no value: an
// earlier batch brought it. Since a batch may bring key before key's own
// answer arrives (two ranks asked for keys of one host at the same time),
// an answer for a key the host now holds is no error; one for a key it
// neither asked for nor holds is, and changes nothing, and so is a
// Batched answer for a key it does not hold (the rank waiting on it is
// told the key is missing rather than left waiting).
func (s *Server) AnswerBatch(key string, a Answer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fetching[key]
	_, held := s.kvs[key]
	switch {
	case f == nil && !held:
		return fmt.Errorf("pmi: answer for key %q, which was not asked for", key)
	case a.Batched && !held:
		delete(s.fetching, key)
		close(f.done)
		return fmt.Errorf("pmi: answer for key %q says it came in a batch, which did not bring it", key)
	}
	value, found := a.Value, a.Found
	if a.Batched {
		value, found = s.kvs[key], true
	}
	for k, v := range a.More {
		if _, held := s.kvs[k]; held {
			continue // this host's own put, or a value it was sent before
		}
		s.kvs[k] = v
		if g := s.fetching[k]; g != nil {
			delete(s.fetching, k)
			g.value, g.found = v, true
			close(g.done)
		}
	}
	if f != nil {
		delete(s.fetching, key)
		f.value, f.found = value, found
		if found {
			s.kvs[key] = value
		}
		close(f.done)
	}
	return nil
}
