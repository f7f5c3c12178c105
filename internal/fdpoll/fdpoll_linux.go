package fdpoll

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Supported reports whether New can work on this system.
const Supported = true

// Poller is an epoll set plus an eventfd that Wake writes. Add, Remove and
// Wake are safe for concurrent use with Wait and with each other; Wait is
// called from one goroutine, the poller's owner, which also calls Close
// once nothing else will.
type Poller struct {
	epfd, wakefd int
	events       []unix.EpollEvent // Wait's buffer, the owner's alone
}

// wakeToken marks the eventfd's events; tokens are non-negative.
const wakeToken = -1

// New makes an empty poller; it holds two descriptors until Close.
func New() (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fdpoll: epoll_create1: %w", err)
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("fdpoll: eventfd: %w", err)
	}
	p := &Poller{epfd: epfd, wakefd: wakefd, events: make([]unix.EpollEvent, 128)}
	if err := p.ctl(unix.EPOLL_CTL_ADD, wakefd, wakeToken); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *Poller) ctl(op, fd int, token int32) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: token}
	if err := unix.EpollCtl(p.epfd, op, fd, &ev); err != nil {
		return fmt.Errorf("fdpoll: epoll_ctl(fd %d): %w", fd, err)
	}
	return nil
}

// Add watches fd for readability (or hang-up, or an error) under token, a
// number of the caller's (an index) at least 0. A descriptor is added
// once; fd stays the caller's.
func (p *Poller) Add(fd int, token int32) error {
	if token < 0 {
		return fmt.Errorf("fdpoll: token %d is negative", token)
	}
	return p.ctl(unix.EPOLL_CTL_ADD, fd, token)
}

// Remove stops watching fd. Call it before closing fd when fd may have
// been duplicated (a duplicate keeps the registration alive); a closed
// descriptor that had no duplicate is removed by the kernel itself.
func (p *Poller) Remove(fd int) error {
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil); err != nil {
		return fmt.Errorf("fdpoll: epoll_ctl(del fd %d): %w", fd, err)
	}
	return nil
}

// Wake makes a Wait in progress (or the next one) return, with woken set.
func (p *Poller) Wake() error {
	var one = [8]byte{1}
	_, err := unix.Write(p.wakefd, one[:])
	if errors.Is(err, unix.EAGAIN) {
		return nil // the counter is already non-zero: a wake is pending
	}
	return err
}

// Wait blocks until a watched descriptor is ready, Wake is called, or
// timeout passes (a negative timeout waits without end), and appends the
// ready tokens to ready. woken reports a Wake since the last Wait.
func (p *Poller) Wait(ready []int32, timeout time.Duration) (_ []int32, woken bool, err error) {
	ms := -1
	if timeout >= 0 {
		// Round up: a wait of 0.4 ms must not spin at 0.
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	var n int
	for {
		n, err = unix.EpollWait(p.epfd, p.events, ms)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return ready, false, fmt.Errorf("fdpoll: epoll_wait: %w", err)
	}
	for _, ev := range p.events[:n] {
		if ev.Fd == wakeToken {
			var b [8]byte
			_, _ = unix.Read(p.wakefd, b[:])
			woken = true
			continue
		}
		ready = append(ready, ev.Fd)
	}
	return ready, woken, nil
}

// Close releases the poller's descriptors (not the watched ones).
func (p *Poller) Close() error {
	err := unix.Close(p.wakefd)
	if e := unix.Close(p.epfd); err == nil {
		err = e
	}
	return err
}
