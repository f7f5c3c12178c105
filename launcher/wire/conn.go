package wire

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gorun-hpc/gorun/internal/handshake"
)

// Protocol is bumped on any incompatible change to the connection
// after the handshake (2: the claimed protocol is bound into the
// handshake's MACs, so protocol-1 agents fail to authenticate).
const Protocol = "2"

// Frame types: the first byte of every frame.
const (
	FrameMsg    byte = 'M'
	FrameOutput byte = 'O'
	FramePing   byte = 'P'
	FrameData   byte = 'D' // preloaded file contents (launcher/preload)
	FrameStdin  byte = 'I' // rank 0's stdin; an empty payload is EOF
)

// MaxFrame bounds a frame a peer may announce; output is sent in pieces of
// at most 64 KiB (launcher/hostagent: pumpOutput).
const MaxFrame = 8 << 20

// Conn frames messages over one connection. Writes are safe for
// concurrent use (wmu); reads belong to one goroutine.
type Conn struct {
	c  net.Conn
	br *bufio.Reader

	// writeTimeout bounds each frame write, so that a writer stuck on a
	// dead link gives up; 0 means no bound (set before concurrent use).
	writeTimeout time.Duration

	wmu sync.Mutex
	bw  *bufio.Writer
}

// NewConn frames c; br, when not nil, is a reader over c that may hold
// bytes already read past the handshake.
func NewConn(c net.Conn, br *bufio.Reader) *Conn {
	if br == nil {
		br = bufio.NewReaderSize(c, 64<<10)
	}
	return &Conn{c: c, br: br, bw: bufio.NewWriterSize(c, 64<<10)}
}

// PingEvery sends a ping frame every interval until stop closes or a write
// fails, so the other end's lease stays alive while nothing else flows.
// It blocks; run it apart from the loop that checks the lease, since a
// write stuck on a dead link must not keep that check from happening.
func (c *Conn) PingEvery(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if c.WriteFrame(FramePing) != nil {
				return
			}
		}
	}
}

// WriteFrame sends one frame made of parts; it blocks until the kernel
// took the bytes or the write deadline passed.
func (w *Conn) WriteFrame(typ byte, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(n))
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if w.writeTimeout > 0 {
		_ = w.c.SetWriteDeadline(time.Now().Add(w.writeTimeout))
	}
	_, _ = w.bw.Write(hdr[:])
	for _, p := range parts {
		_, _ = w.bw.Write(p)
	}
	return w.bw.Flush()
}

// Send sends m as one message frame.
func (w *Conn) Send(m Msg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return w.WriteFrame(FrameMsg, b)
}

// SetWriteTimeout bounds each later frame write by d (0: no bound). Call
// it before the Conn is used concurrently.
func (w *Conn) SetWriteTimeout(d time.Duration) { w.writeTimeout = d }

// SetReadDeadline sets the underlying connection's read deadline.
func (w *Conn) SetReadDeadline(t time.Time) error { return w.c.SetReadDeadline(t) }

// Peek returns the next n bytes without consuming them, blocking until
// they arrive or the read deadline passes; it belongs to the reading
// goroutine.
func (w *Conn) Peek(n int) ([]byte, error) { return w.br.Peek(n) }

// NetConn is the underlying connection, for what framing does not cover
// (deadlines of the handshake's caller, a TCP half-close).
func (w *Conn) NetConn() net.Conn { return w.c }

// Close closes the underlying connection; a blocked read or write returns.
func (w *Conn) Close() error { return w.c.Close() }

// SendOutput sends a piece of a rank's stream (1 stdout, 2 stderr).
func (w *Conn) SendOutput(rank int, stream byte, data []byte) error {
	var hdr [5]byte
	binary.BigEndian.PutUint32(hdr[:4], uint32(rank))
	hdr[4] = stream
	return w.WriteFrame(FrameOutput, hdr[:], data)
}

// ReadFrame returns the next frame. The payload is valid until the next
// call.
func (w *Conn) ReadFrame(buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(w.br, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds the limit", n)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(w.br, buf); err != nil {
		return 0, nil, err
	}
	return hdr[0], buf, nil
}

// setupMsg decodes a frame read during setup: ok is false for a ping,
// which the reader skips; any frame but a message or a ping is an error.
func setupMsg(typ byte, p []byte) (m Msg, ok bool, err error) {
	switch typ {
	case FramePing:
		return Msg{}, false, nil
	case FrameMsg:
		if err := json.Unmarshal(p, &m); err != nil {
			return Msg{}, false, fmt.Errorf("bad message: %w", err)
		}
		return m, true, nil
	}
	return Msg{}, false, fmt.Errorf("unexpected frame %q during setup", typ)
}

// ReadMsg reads frames until a message arrives, skipping pings; used
// during setup, when no output flows yet.
func (w *Conn) ReadMsg() (Msg, error) {
	for {
		typ, p, err := w.ReadFrame(nil)
		if err != nil {
			return Msg{}, err
		}
		if m, ok, err := setupMsg(typ, p); ok || err != nil {
			return m, err
		}
	}
}

// ErrAuth is a failed proof of the job secret.
var ErrAuth = errors.New("launcher: agent connection: authentication failed (wrong job secret)")

// proofFields are what one side's proof of the job secret binds (see
// the handshake above): the claiming side's role with the protocol
// ("gorun/2", "agent/2"), the job, the host and both nonces. With the
// protocol bound, neither side's claim can be altered in flight; with the
// role, one side's proof can never be replayed as the other's.
func proofFields(role, proto, job, host, nonceA, nonceB string) []string {
	return []string{role + "/" + proto, job, host, nonceA, nonceB}
}

// DialAuth is the agent side of the handshake.
func DialAuth(c net.Conn, secret []byte, job, host string) (*Conn, error) {
	return DialAuthAs(c, secret, job, host, Protocol)
}

// DialAuthAs is DialAuth claiming protocol proto (tests pose as agents of
// other versions with it).
func DialAuthAs(c net.Conn, secret []byte, job, host, proto string) (*Conn, error) {
	br := bufio.NewReader(c)
	nonceA := handshake.Nonce()
	if _, err := fmt.Fprintf(c, "GORUN-AGENT/%s %s %s %s\n", proto, job, host, nonceA); err != nil {
		return nil, err
	}
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("handshake: %w", err)
	}
	f := strings.Fields(line)
	if len(f) >= 1 && f[0] == "NO" {
		return nil, fmt.Errorf("gorun refused this agent: %s", strings.TrimSpace(strings.TrimPrefix(line, "NO")))
	}
	if len(f) != 3 || f[0] != "OK" {
		return nil, fmt.Errorf("handshake: unexpected reply %q", strings.TrimSpace(line))
	}
	nonceB := f[1]
	if !handshake.Verify(secret, f[2], proofFields("gorun", proto, job, host, nonceA, nonceB)...) {
		return nil, ErrAuth
	}
	proof, err := handshake.MAC(secret, proofFields("agent", proto, job, host, nonceA, nonceB)...)
	if err != nil {
		return nil, fmt.Errorf("handshake: %w", err)
	}
	if _, err := fmt.Fprintf(c, "%s\n", proof); err != nil {
		return nil, err
	}
	return NewConn(c, br), nil
}

// HandshakeError is a connection to the host-agent port that did not prove
// it holds the job secret. gorun logs and drops it; it is never a host's
// failure, since anyone who can reach the port can cause one. Claim is
// what the peer said about itself (unverified), kept for the error message
// of a host that later fails on its own.
type HandshakeError struct {
	// Remote is the peer's address.
	Remote string
	// Claim is the unverified first line's host and protocol, if it had
	// the right shape ("" otherwise).
	ClaimHost, ClaimProtocol string
	Err                      error
}

func (e *HandshakeError) Error() string {
	s := "launcher: unauthenticated connection to the host-agent port from " + e.Remote
	if e.ClaimHost != "" {
		s += fmt.Sprintf(" (claimed host %q, protocol %s)", e.ClaimHost, e.ClaimProtocol)
	}
	return s + ": " + e.Err.Error()
}

func (e *HandshakeError) Unwrap() error { return e.Err }

// AcceptAuth is gorun's side: it returns the host the agent is once the
// agent proved it holds the secret. Nothing the peer says is acted on
// before that: a stranger, a wrong secret or a garbled line is a
// *HandshakeError (log it, drop it); an authenticated agent of another
// protocol is a *ProtocolError naming its host.
func AcceptAuth(c net.Conn, secret []byte, job string, known func(host string) bool) (*Conn, string, error) {
	herr := &HandshakeError{Remote: remoteOf(c)}
	br := bufio.NewReader(io.LimitReader(c, 4096))
	line, err := br.ReadString('\n')
	if err != nil {
		herr.Err = fmt.Errorf("no greeting: %w", err)
		return nil, "", herr
	}
	f := strings.Fields(line)
	if len(f) != 4 || !strings.HasPrefix(f[0], "GORUN-AGENT/") {
		fmt.Fprintf(c, "NO not a gorun agent\n")
		herr.Err = fmt.Errorf("not a gorun agent: %.60q", line)
		return nil, "", herr
	}
	proto, claimJob, host, nonceA := strings.TrimPrefix(f[0], "GORUN-AGENT/"), f[1], f[2], f[3]
	herr.ClaimHost, herr.ClaimProtocol = host, proto
	if claimJob != job || !known(host) {
		fmt.Fprintf(c, "NO unknown job or host\n")
		herr.Err = fmt.Errorf("agent for job %q host %q is not part of this job", claimJob, host)
		return nil, "", herr
	}
	nonceB := handshake.Nonce()
	proof, err := handshake.MAC(secret, proofFields("gorun", proto, job, host, nonceA, nonceB)...)
	if err != nil {
		fmt.Fprintf(c, "NO malformed greeting\n")
		herr.Err = err
		return nil, "", herr
	}
	if _, err := fmt.Fprintf(c, "OK %s %s\n", nonceB, proof); err != nil {
		herr.Err = err
		return nil, "", herr
	}
	line, err = br.ReadString('\n')
	if err != nil {
		herr.Err = fmt.Errorf("no proof: %w", err)
		return nil, "", herr
	}
	if !handshake.Verify(secret, strings.TrimSpace(line), proofFields("agent", proto, job, host, nonceA, nonceB)...) {
		herr.Err = ErrAuth
		return nil, "", herr
	}
	// Authenticated: from here the peer's words count.
	if proto != Protocol {
		fmt.Fprintf(c, "NO agent protocol %s, gorun speaks %s (install the same gorun version on every host)\n", proto, Protocol)
		return nil, host, &ProtocolError{Host: host, Remote: proto, Local: Protocol}
	}
	// The limited reader is done with; nothing was read past the line
	// because the agent waits for OK before it sends more.
	return NewConn(c, nil), host, nil
}

// ProtocolError is an agent that proved it holds the job secret but speaks
// another protocol: a host running another gorun version.
type ProtocolError struct {
	Host          string
	Remote, Local string // the protocols the agent and gorun speak
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("host %s's agent speaks protocol %s, this gorun %s", e.Host, e.Remote, e.Local)
}

func remoteOf(c net.Conn) string {
	if a := c.RemoteAddr(); a != nil {
		return a.String()
	}
	return "?"
}
