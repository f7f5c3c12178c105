// Package tailbuf owns a writer that keeps only the last bytes written to
// it: the end of a helper process's output (an ssh or srun that starts a
// host agent, a tree child's starter), which is where its reason for
// failing is, quoted in the error that names it. Its memory is bounded
// however much the process writes.
package tailbuf

import (
	"strings"
	"sync"
)

// Size is how many of the last bytes written a Buffer keeps.
const Size = 4096

// Buffer keeps the last Size bytes written to it. The zero value is ready
// to use; Write and Tail are safe for concurrent use, so one Buffer can be
// a command's Stdout and Stderr at once.
type Buffer struct {
	mu sync.Mutex
	b  []byte
}

// Write keeps p's end; it never fails.
func (t *Buffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > Size {
		t.b = append(t.b[:0:0], t.b[len(t.b)-Size:]...)
	}
	return len(p), nil
}

// Tail returns what is kept, without leading or trailing white space.
func (t *Buffer) Tail() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}
