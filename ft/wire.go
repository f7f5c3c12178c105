package ft

import (
	"bufio"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorun-hpc/gorun/internal/handshake"
)

// The service's connection. A replica dials the service and both sides
// prove they hold the job's key before anything else is exchanged (the
// construction of gorun's host-agent handshake, with a key of its own):
//
//	replica → service   GORUN-FT/<proto> <job> <replica> <incarnation> <nonceA>\n
//	service → replica   OK <nonceB> <mac("service")>\n   (or NO <reason>\n)
//	replica → service   <mac("replica")>\n
//
// mac(role) is HMAC-SHA256 keyed with DeriveKey's key over the role, the
// protocol, the job, the replica, the incarnation and both nonces, each
// NUL-terminated (internal/handshake), so a
// stranger can neither pose as the service nor as a replica, nor replay
// an old handshake. Then JSON messages flow both ways, one per line
// (message); the replica's first is its hello.

// wireProto is bumped on an incompatible change of the messages.
const wireProto = "1"

// handshakeMax bounds what either side reads before the other proved it
// holds the key: the handshake's lines, and what follows them in the same
// reads (the hello), carried over to the message reader.
const handshakeMax = 4096

// maxLine bounds one message line (a quorum of thousands of replicas fits).
const maxLine = 4 << 20

// message is every message on the service's connection; T says which
// fields are set.
type message struct {
	// T is, from a replica: "hello" (Addr, Host), "quorum" (asks for
	// the next quorum at Step), "vote" (Round, OK, Why), "healed" (ID,
	// Step, Bytes, Took, Sources), "served" (ID, Bytes: a heal source's
	// slice), "bye" (leaving for good). From the service: "quorum"
	// (Round, ID, Step, Participants), "commit" (Round, OK, Why), "fail"
	// (Round, ID, Why: the quorum failed; its communicator must be
	// aborted) and "finished" (Step: nobody holds the job's last step any
	// more; a replica behind it cannot heal).
	T            string        `json:"t"`
	Addr         string        `json:"addr,omitempty"`
	Host         string        `json:"host,omitempty"`
	Step         int64         `json:"step,omitempty"`
	Round        int64         `json:"round,omitempty"`
	ID           int64         `json:"id,omitempty"`
	OK           bool          `json:"ok,omitempty"`
	Why          string        `json:"why,omitempty"`
	Participants []Participant `json:"participants,omitempty"`
	Group        []Participant `json:"group,omitempty"`
	Bytes        int64         `json:"bytes,omitempty"`
	Took         float64       `json:"took,omitempty"`
	Sources      []int         `json:"sources,omitempty"`
}

// DeriveKey is the service's key for a job: HKDF-SHA256 of the job secret,
// salted with the job id, with KeyPurpose.
func DeriveKey(secret []byte, jobID string) ([]byte, error) {
	if len(secret) == 0 {
		return nil, fmt.Errorf("%w: empty job secret: no key can be derived", ErrConfig)
	}
	return hkdf.Key(sha256.New, secret, []byte(jobID), KeyPurpose, 32)
}

// proofFields are what one side's proof of the key binds: its role
// ("service" or "replica"), the protocol, the job, the replica, the
// incarnation and both nonces.
func proofFields(role, job string, replica, inc int, nonceA, nonceB string) []string {
	return []string{role, wireProto, job, strconv.Itoa(replica), strconv.Itoa(inc), nonceA, nonceB}
}

// conn is one end of a service connection after the handshake: a line
// reader owned by one goroutine, and writes serialized by mu.
type conn struct {
	c  net.Conn
	br *bufio.Reader
	mu sync.Mutex // guards writes on c
}

func (c *conn) send(m message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err = c.c.Write(b)
	return err
}

func (c *conn) recv() (message, error) {
	var m message
	line, err := c.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return m, fmt.Errorf("ft: message longer than %d bytes", maxLine)
	}
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(line, &m); err != nil {
		return m, fmt.Errorf("ft: bad message: %w", err)
	}
	return m, nil
}

// dialAuth is the replica's side of the handshake over c.
func dialAuth(c net.Conn, key []byte, job string, replica, inc int) (*conn, error) {
	br := bufio.NewReaderSize(io.LimitReader(c, handshakeMax), 4096)
	nA := handshake.Nonce()
	if _, err := fmt.Fprintf(c, "GORUN-FT/%s %s %d %d %s\n", wireProto, job, replica, inc, nA); err != nil {
		return nil, err
	}
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("handshake: %w", err)
	}
	f := strings.Fields(line)
	if len(f) >= 1 && f[0] == "NO" {
		return nil, fmt.Errorf("the quorum service refused replica %d: %s", replica, strings.TrimSpace(strings.TrimPrefix(line, "NO")))
	}
	if len(f) != 3 || f[0] != "OK" {
		return nil, fmt.Errorf("handshake: unexpected reply %.80q", strings.TrimSpace(line))
	}
	if !handshake.Verify(key, f[2], proofFields("service", job, replica, inc, nA, f[1])...) {
		return nil, fmt.Errorf("%w: the quorum service at %s", ErrAuth, c.RemoteAddr())
	}
	proof, err := handshake.MAC(key, proofFields("replica", job, replica, inc, nA, f[1])...)
	if err != nil {
		return nil, fmt.Errorf("handshake: %w", err)
	}
	if _, err := fmt.Fprintf(c, "%s\n", proof); err != nil {
		return nil, err
	}
	return &conn{c: c, br: bufio.NewReaderSize(io.MultiReader(br, c), maxLine)}, nil
}

// acceptAuth is the service's side: the replica and incarnation once the
// peer proved it holds the key. Nothing the peer says counts before.
func acceptAuth(c net.Conn, key []byte, job string, replicas int) (*conn, int, int, error) {
	// Bounded: a stranger's endless line costs at most this much.
	br := bufio.NewReaderSize(io.LimitReader(c, handshakeMax), 4096)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, 0, 0, fmt.Errorf("no greeting: %w", err)
	}
	f := strings.Fields(line)
	if len(f) != 5 || f[0] != "GORUN-FT/"+wireProto {
		fmt.Fprintf(c, "NO not a gorun fault-tolerant replica of protocol %s\n", wireProto)
		return nil, 0, 0, fmt.Errorf("not a replica: %.60q", line)
	}
	replica, err1 := strconv.Atoi(f[2])
	inc, err2 := strconv.Atoi(f[3])
	if f[1] != job || err1 != nil || err2 != nil || replica < 0 || replica >= replicas || inc < 0 {
		fmt.Fprintf(c, "NO unknown job or replica\n")
		return nil, 0, 0, fmt.Errorf("job %q replica %q incarnation %q is not part of this job", f[1], f[2], f[3])
	}
	nB := handshake.Nonce()
	proof, err := handshake.MAC(key, proofFields("service", job, replica, inc, f[4], nB)...)
	if err != nil {
		fmt.Fprintf(c, "NO malformed greeting\n")
		return nil, 0, 0, fmt.Errorf("greeting of replica %d: %w", replica, err)
	}
	if _, err := fmt.Fprintf(c, "OK %s %s\n", nB, proof); err != nil {
		return nil, 0, 0, err
	}
	line, err = br.ReadString('\n')
	if err != nil {
		return nil, 0, 0, fmt.Errorf("no proof: %w", err)
	}
	if !handshake.Verify(key, strings.TrimSpace(line), proofFields("replica", job, replica, inc, f[4], nB)...) {
		return nil, 0, 0, ErrAuth
	}
	return &conn{c: c, br: bufio.NewReaderSize(io.MultiReader(br, c), maxLine)}, replica, inc, nil
}
