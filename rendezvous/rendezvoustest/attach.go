package rendezvoustest

import (
	"context"
	"errors"
	"net"
	"sync"
)

// AttachNet is an in-memory rendezvous.AttachNet: named listeners whose
// connections are net.Pipe pairs, so attached ranks run under
// testing/synctest. The zero value is ready; methods are safe for concurrent
// use. Closing a connection end is seen at the other end at once, as a
// process exit closes a Unix socket.
type AttachNet struct {
	mu        sync.Mutex
	listeners map[string]*pipeListener
}

// Listen returns a listener for name; a name in use is an error.
func (a *AttachNet) Listen(name string) (net.Listener, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.listeners == nil {
		a.listeners = make(map[string]*pipeListener)
	}
	if _, used := a.listeners[name]; used {
		return nil, errors.New("rendezvoustest: attach name " + name + " in use")
	}
	l := &pipeListener{net: a, name: name, ch: make(chan net.Conn), done: make(chan struct{})}
	a.listeners[name] = l
	return l, nil
}

// Dial connects to the listener for name: refused when there is none.
func (a *AttachNet) Dial(ctx context.Context, name string) (net.Conn, error) {
	a.mu.Lock()
	l := a.listeners[name]
	a.mu.Unlock()
	if l == nil {
		return nil, ErrRefused
	}
	c, s := net.Pipe()
	select {
	case l.ch <- s:
		return c, nil
	case <-l.done:
		return nil, ErrRefused
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeListener struct {
	net  *AttachNet
	name string
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.net.mu.Lock()
		delete(l.net.listeners, l.name)
		l.net.mu.Unlock()
	})
	return nil
}

func (l *pipeListener) Addr() net.Addr { return addr("attach:" + l.name) }
