//go:build !linux

package fdpoll

import (
	"errors"
	"time"
)

// Supported reports whether New can work on this system.
const Supported = false

// Poller is not available here; see the package comment.
type Poller struct{}

// New fails: there is no epoll here.
func New() (*Poller, error) { return nil, errors.New("fdpoll: not supported on this system") }

func (p *Poller) Add(fd int, token int32) error { return errors.New("fdpoll: not supported") }
func (p *Poller) Remove(fd int) error           { return errors.New("fdpoll: not supported") }
func (p *Poller) Wake() error                   { return errors.New("fdpoll: not supported") }
func (p *Poller) Wait(ready []int32, timeout time.Duration) ([]int32, bool, error) {
	return ready, false, errors.New("fdpoll: not supported")
}
func (p *Poller) Close() error { return nil }
