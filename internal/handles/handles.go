// Package handles names live objects by integer handles, as a C ABI hands
// them out (libgorun's communicators, requests, executors, fault-tolerant
// replicas): add an object, look it up by its handle, remove it, and say
// clearly when a handle names nothing.
//
// Handles are positive and never reused within a process, across every
// Table together: a stale handle, or one of another kind (every kind is an
// int64_t in C, so a caller can mix them up), is refused as unknown
// rather than naming some other live object. What an object is, and what
// freeing it does, stays with the caller.
package handles

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// last is the most recent handle given out by any Table in the process.
var last atomic.Int64

// UnknownError is a handle that names nothing in its Table: never made,
// removed, or of another kind.
type UnknownError struct {
	// Noun is what the Table holds ("communicator").
	Noun string
	// Handle is the handle asked for.
	Handle int64
	// Gone says how a handle stops naming one ("freed, or never made").
	Gone string
}

func (e *UnknownError) Error() string {
	return fmt.Sprintf("no %s %d (%s)", e.Noun, e.Handle, e.Gone)
}

// Table maps handles to objects of type T. Safe for concurrent use; no
// method blocks on anything but the Table's own short lock, which is held
// only inside its methods, so a caller may hold its own locks around them.
type Table[T any] struct {
	noun, gone string

	mu sync.Mutex
	m  map[int64]T // guarded by mu
}

// New returns an empty Table of noun ("executor"); gone ("freed, or never
// made") ends the error for a handle that names nothing.
func New[T any](noun, gone string) *Table[T] {
	return &Table[T]{noun: noun, gone: gone, m: map[int64]T{}}
}

// Add names v by a new handle and returns it.
func (t *Table[T]) Add(v T) int64 {
	h := last.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[h] = v
	return h
}

// Get returns the object h names, or an *UnknownError.
func (t *Table[T]) Get(h int64) (T, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[h]
	if !ok {
		return v, t.unknown(h)
	}
	return v, nil
}

// Take removes h and returns the object it named, or an *UnknownError
// (then nothing changed). Of two callers taking one handle, exactly one
// gets the object.
func (t *Table[T]) Take(h int64) (T, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[h]
	if !ok {
		return v, t.unknown(h)
	}
	delete(t.m, h)
	return v, nil
}

// Drop removes h if it names anything; dropping an unknown handle (0, a
// handle already taken) does nothing.
func (t *Table[T]) Drop(h int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, h)
}

// Clear removes every handle. The handles it removed stay unknown for
// good: new ones are never the same numbers.
func (t *Table[T]) Clear() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.m)
}

// TakeAll removes every handle and returns the objects they named, in no
// particular order, for a caller that must release each (a shutdown).
func (t *Table[T]) TakeAll() []T {
	t.mu.Lock()
	defer t.mu.Unlock()
	all := make([]T, 0, len(t.m))
	for _, v := range t.m {
		all = append(all, v)
	}
	clear(t.m)
	return all
}

// Len is how many handles name an object now.
func (t *Table[T]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

func (t *Table[T]) unknown(h int64) error {
	return &UnknownError{Noun: t.noun, Handle: h, Gone: t.gone}
}
