package pmi

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/internal/connlimit"
)

// Config describes what one host's server tells its ranks.
type Config struct {
	// KVSName is the job's key-value space name, the same on every host
	// (gorun uses "gorun-" and the job id). At most KVSNameMax bytes.
	KVSName string
	// Size is the number of ranks in the job (all hosts).
	Size int
	// Ranks lists the global ranks this server serves: the ranks on its
	// host. A barrier is complete on this host once every one of them
	// entered it.
	Ranks []int
	// AppNum is the application number MPI reports as MPI_APPNUM; gorun
	// runs one program, so it is 0.
	AppNum int
	// Fetch makes the server ask its owner for a key it does not hold
	// (a Get request, answered with Answer) instead of replying "not
	// found". An owner that sets it releases barriers with no values and
	// keeps every host's puts itself; each host then receives only the
	// values its ranks read, once per host, rather than the whole job's
	// keys at every barrier.
	Fetch bool
	// ProcessMapping is the value of the reserved key PMI_process_mapping
	// (see ProcessMapping); "" makes gets of it fail as an unknown key.
	ProcessMapping string
	// Logger receives protocol errors and per-request debug lines (field
	// "rank").
	Logger zerolog.Logger
	// RequestTimeout bounds how long a request may take to arrive once its
	// first byte did; 0 means DefaultRequestTimeout. A real client writes
	// each request at once, so a request still unfinished after it is junk
	// (the rank gets an error and its connection is closed). The time
	// between requests is not bounded: a rank may compute for hours.
	RequestTimeout time.Duration
}

// DefaultRequestTimeout is RequestTimeout's default: generous for a loaded
// host, short next to what a user waits before calling a job stuck.
const DefaultRequestTimeout = 10 * time.Second

// DefaultConfig returns a Config for a one-rank job with a placeholder KVS
// name; callers set KVSName, Size, Ranks and ProcessMapping.
func DefaultConfig() Config {
	return Config{KVSName: "kvs_0", Size: 1, Ranks: []int{0}, Logger: zerolog.Nop()}
}

// Validate reports the first field that cannot work.
func (c Config) Validate() error {
	switch {
	case !validToken(c.KVSName, KVSNameMax):
		return fmt.Errorf("pmi: KVSName %q must be 1-%d bytes without spaces", c.KVSName, KVSNameMax)
	case c.Size < 1:
		return fmt.Errorf("pmi: Size %d must be at least 1", c.Size)
	case len(c.Ranks) == 0:
		return errors.New("pmi: Ranks is empty: a server serves at least one rank")
	case c.ProcessMapping != "" && !validToken(c.ProcessMapping, VallenMax):
		return fmt.Errorf("pmi: ProcessMapping %q is not a valid value", c.ProcessMapping)
	}
	seen := map[int]bool{}
	for _, r := range c.Ranks {
		if r < 0 || r >= c.Size {
			return fmt.Errorf("pmi: rank %d outside 0..%d", r, c.Size-1)
		}
		if seen[r] {
			return fmt.Errorf("pmi: rank %d listed twice", r)
		}
		seen[r] = true
	}
	return nil
}

// RequestKind says what a Request asks of the server's owner.
type RequestKind int

const (
	// Fence: every local rank entered barrier number Epoch. The owner
	// gathers the fences of every host and calls Release(Epoch, union of
	// their Puts) on each.
	Fence RequestKind = iota + 1
	// Abort: Rank called PMI_Abort (MPI_Abort, or an MPI error it could
	// not recover from) with Code and Message. The owner ends the job;
	// the rank waits for that and gets no reply.
	Abort
	// Get: a local rank asked for Key, which this host does not hold
	// (Config.Fetch). The owner answers with Answer; the rank waits.
	Get
)

// Request is something only the owner can do.
type Request struct {
	Kind RequestKind
	// Epoch numbers the barriers from 0 (Fence).
	Epoch int
	// Puts are the key/value pairs put on this host since the previous
	// fence (Fence). The map is the owner's.
	Puts map[string]string
	// Key is the key a Get asks for.
	Key string
	// Rank, Code and Message describe an Abort.
	Rank    int
	Code    int
	Message string
}

// rankState is what the server knows of one local rank.
type rankState struct {
	// connected: a connection was bound to the rank; a second one is
	// refused (a stranger on the port, or a confused client).
	connected   bool
	initialized bool
	finalized   bool
	inBarrier   bool
}

// Server serves the PMI-1 wire protocol to the ranks of one host. Its
// methods are safe for concurrent use. ServeConn blocks for the life of a
// connection; Requests must be drained by the owner, or barriers and aborts
// are never acted on.
type Server struct {
	cfg  Config
	log  zerolog.Logger
	reqs chan Request
	// done closes on Close: waits in barriers end, serving stops.
	done chan struct{}
	wg   sync.WaitGroup // connection servers and the accept loop

	mu sync.Mutex
	// Fields below are guarded by mu.
	ranks map[int]*rankState
	// kvs holds every value a local rank may read: released values from
	// all hosts and this host's own puts (readable by their host at once).
	kvs map[string]string
	// pending holds this host's puts since the last fence.
	pending map[string]string
	entered int // local ranks in the current barrier
	epoch   int
	// released closes when the current epoch's barrier is released.
	released chan struct{}
	conns    map[net.Conn]struct{}
	ln       net.Listener
	ids      map[int]int // port mode: PMI_ID → rank
	idOf     map[int]int // port mode: rank → PMI_ID
	closed   bool
	// nodeAttrs is PMI-2's host-local store; attrChanged closes when a
	// value is added (ranks may wait for one).
	nodeAttrs   map[string]string
	attrChanged chan struct{}
	// fetching holds the keys asked of the owner and not yet answered
	// (Config.Fetch): ranks asking for one of them wait on the same
	// fetch, so a host asks for each key once.
	fetching map[string]*fetch
}

// fetch is one key asked of the owner; done closes when Answer came.
type fetch struct {
	done  chan struct{}
	value string
	found bool
}

// NewServer returns a server for cfg; nothing is served until ServeConn or
// Listen.
func NewServer(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg,
		log: cfg.Logger,
		// Each local rank waits on at most one request of its own (an
		// abort, after which it waits, or a get) and the host has at
		// most one fence. A batch answer (AnswerBatch) can free ranks
		// whose gets are still queued, and they ask again: those stale
		// gets are at most one per rank but one, the last batch's, since
		// the owner answers in order and so drains them before it can
		// send the next batch. Twice the ranks and the fence is then
		// what can be outstanding: this capacity means the server never
		// blocks on a slow owner.
		reqs:     make(chan Request, 2*len(cfg.Ranks)+1),
		done:     make(chan struct{}),
		ranks:    map[int]*rankState{},
		kvs:      map[string]string{},
		pending:  map[string]string{},
		released: make(chan struct{}),
		conns:    map[net.Conn]struct{}{},
		fetching: map[string]*fetch{},
	}
	for _, r := range cfg.Ranks {
		s.ranks[r] = &rankState{}
	}
	return s, nil
}

// Requests delivers fences and aborts to the owner. It is closed by Close.
func (s *Server) Requests() <-chan Request { return s.reqs }

// Release ends barrier epoch on this host: puts become readable and every
// waiting rank gets barrier_out. Without Config.Fetch, puts must be the
// union of every host's fence for that epoch; with it, puts may be nil
// (the owner answers gets instead). A release for any other epoch is an error and changes
// nothing.
func (s *Server) Release(epoch int, puts map[string]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("pmi: release after close")
	}
	if epoch != s.epoch || s.entered != len(s.ranks) {
		return fmt.Errorf("pmi: release of barrier %d, but barrier %d has %d of %d ranks in it",
			epoch, s.epoch, s.entered, len(s.ranks))
	}
	maps.Copy(s.kvs, puts)
	s.entered = 0
	s.epoch++
	for _, st := range s.ranks {
		st.inBarrier = false
	}
	close(s.released)
	s.released = make(chan struct{})
	return nil
}

// State reports whether rank sent init and whether it sent finalize. The
// launcher uses it to tell a rank that exited 0 halfway through MPI (a
// failure: the others would wait for it in a barrier forever) from one
// that finished or never used MPI.
func (s *Server) State(rank int) (initialized, finalized bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.ranks[rank]; st != nil {
		return st.initialized, st.finalized
	}
	return false, false
}

// ServeConn serves rank over c (the PMI_FD mode: the connection is the
// rank's by construction) until EOF or Close, then closes c.
func (s *Server) ServeConn(rank int, c net.Conn) error {
	if !s.track(c) {
		c.Close()
		return net.ErrClosed
	}
	defer s.untrack(c)
	if err := s.bind(rank); err != nil {
		return err
	}
	return s.serve(rank, bufio.NewReaderSize(c, MaxLine), c)
}

// Listen serves the PMI_PORT mode on a TCP listener at addr (host:port,
// port 0 for any). Each rank dials it and first sends "cmd=initack
// pmiid=ID" with its ID(rank); the server answers with the rank, size and
// debug level, then serves as over PMI_FD. It returns the address to put
// in PMI_PORT.
//
// IDs are random, not the rank numbers: anyone on the host can dial a TCP
// port, and a stranger who guessed an ID could read and write the job's
// key-value space; each ID is also accepted only once. On Linux a
// connection from another user's process is refused before it is read
// (peer_linux.go), and the connections in their first line are bounded.
func (s *Server) Listen(addr string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.ln != nil {
		return "", errors.New("pmi: Listen on a closed or listening server")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("pmi: listen: %w", err)
	}
	s.ids, s.idOf = map[int]int{}, map[int]int{}
	for _, r := range s.cfg.Ranks {
		for {
			var b [4]byte
			_, _ = rand.Read(b[:])
			id := int(binary.BigEndian.Uint32(b[:]) >> 1)
			if _, dup := s.ids[id]; id != 0 && !dup {
				s.ids[id], s.idOf[r] = r, id
				break
			}
		}
	}
	// Only this host's ranks ever connect, one each; the bound keeps a
	// stranger's held connections from costing more than that.
	gate, err := connlimit.New(connlimit.Config{Max: max(len(s.cfg.Ranks), 1) + 16, PerSource: max(len(s.cfg.Ranks), 1) + 16}, nil)
	if err != nil {
		ln.Close()
		return "", err
	}
	s.ln = ln
	s.wg.Go(func() { s.acceptLoop(gate) })
	return ln.Addr().String(), nil
}

// portHandshakeTimeout bounds a PMI port connection's first line.
const portHandshakeTimeout = 30 * time.Second

// ID is the PMI_ID rank presents in the PMI_PORT mode; 0 before Listen.
func (s *Server) ID(rank int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.idOf[rank]
}

func (s *Server) acceptLoop(gate *connlimit.Gate) {
	defer gate.Close()
	for {
		c, release, err := gate.Accept(s.ln)
		if err != nil {
			return
		}
		// Another user's process is refused before it says anything:
		// it must not get to try PMI ids (peer_linux.go).
		if err := checkPortPeer(c); err != nil {
			release()
			s.log.Warn().Err(err).Msg("PMI port connection refused")
			c.Close()
			continue
		}
		if !s.track(c) {
			release()
			c.Close()
			return
		}
		s.wg.Go(func() {
			defer s.untrack(c)
			br := bufio.NewReaderSize(c, MaxLine)
			// A rank sends its first line as soon as it connects.
			_ = c.SetReadDeadline(time.Now().Add(portHandshakeTimeout))
			rank, err := s.handshake(br, c)
			_ = c.SetReadDeadline(time.Time{})
			release()
			if err != nil {
				s.log.Warn().Err(err).Str("peer", c.RemoteAddr().String()).Msg("PMI port connection refused")
				return
			}
			if rank < 0 {
				err = s.serve2(-1, s.bindID, br, c)
				if err != nil {
					s.log.Warn().Err(err).Str("peer", c.RemoteAddr().String()).Msg("PMI-2 port connection ended")
				}
				return
			}
			_ = s.serve(rank, br, c)
		})
	}
}

// handshake reads "cmd=initack pmiid=ID" and answers as MPICH's client
// expects: initack, then size, rank and debug, one "cmd=set" line each.
func (s *Server) handshake(br *bufio.Reader, w io.Writer) (int, error) {
	line, err := readLine(br)
	if err != nil {
		return 0, err
	}
	m, err := parseLine(line)
	if err != nil {
		return 0, err
	}
	if m.cmd == "init" && m.fields["pmi_version"] == "2" {
		// PMI-2 over the port: no initack; the rank names itself with
		// its PMI_ID in fullinit.
		if _, err := io.WriteString(w, formatLine("response_to_init", "pmi_version", "2", "pmi_subversion", "0", "rc", "0")); err != nil {
			return 0, err
		}
		return -1, nil
	}
	if m.cmd != "initack" {
		return 0, fmt.Errorf("%w: first line %q is not cmd=initack", ErrProtocol, line)
	}
	rank, err := s.bindID(m.fields["pmiid"])
	if err != nil {
		return 0, err
	}
	_, err = io.WriteString(w, formatLine("initack")+formatLine("set", "size", strconv.Itoa(s.cfg.Size))+
		formatLine("set", "rank", strconv.Itoa(rank))+formatLine("set", "debug", "0"))
	return rank, err
}

// bindID binds the rank whose PMI_ID is id (port mode).
func (s *Server) bindID(id string) (int, error) {
	n, err := strconv.Atoi(id)
	s.mu.Lock()
	rank, ok := s.ids[n]
	s.mu.Unlock()
	if err != nil || !ok {
		return 0, fmt.Errorf("%w: unknown PMI id %q", ErrProtocol, id)
	}
	return rank, s.bind(rank)
}

// bind marks rank as connected; a second connection for one rank is an
// error.
func (s *Server) bind(rank int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ranks[rank]
	switch {
	case st == nil:
		return fmt.Errorf("pmi: rank %d is not served here", rank)
	case st.connected:
		return fmt.Errorf("pmi: rank %d is already connected", rank)
	}
	st.connected = true
	return nil
}

// track registers c for Close; false when the server is closed.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Close stops serving: the listener and every connection close, ranks
// waiting in a barrier are let go without an answer (their process is
// being torn down), and Requests closes. It returns once every goroutine
// the server started has ended; calling it again does nothing.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	if s.ln != nil {
		s.ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	// Every sender checks closed under mu before sending, so nothing
	// sends after this point.
	s.mu.Lock()
	close(s.reqs)
	s.mu.Unlock()
	return nil
}

// readLine reads one line without its newline. A line longer than four of
// the client's buffers is a protocol error (nothing legitimate is that
// long; the bound keeps a stranger from making the server buffer without
// end).
func readLine(br *bufio.Reader) (string, error) {
	var b []byte
	for {
		frag, err := br.ReadSlice('\n')
		b = append(b, frag...)
		if err == nil {
			return strings.TrimRight(string(b), "\r\n"), nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return "", err
		}
		if len(b) > 4*MaxLine {
			return "", fmt.Errorf("%w: line longer than %d bytes", ErrProtocol, 4*MaxLine)
		}
	}
}

// readDeadliner is the part of a connection readRequest needs.
type readDeadliner interface{ SetReadDeadline(time.Time) error }

// readRequest waits, without a bound, for the first byte of the next
// request (a rank may compute for hours between calls), then runs read
// with RequestTimeout armed on conn (when conn takes a deadline). A read
// that ends in the deadline is a request that never finished: a protocol
// error the rank is told about.
func (s *Server) readRequest(br *bufio.Reader, conn any, read func() error) error {
	if _, err := br.Peek(1); err != nil {
		return err
	}
	d, ok := conn.(readDeadliner)
	if !ok {
		return read()
	}
	timeout := s.cfg.RequestTimeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	_ = d.SetReadDeadline(time.Now().Add(timeout))
	err := read()
	_ = d.SetReadDeadline(time.Time{})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w: request unfinished %v after its first byte (junk, or a client that stopped mid-request)", ErrProtocol, timeout)
	}
	return err
}

// errorReply is the message of the error reply to a malformed request,
// within one client line and without spaces (PMI-1 values have none).
func errorReply(err error) string {
	msg := strings.Map(func(r rune) rune {
		if r == ' ' || r == '\n' || r == '\t' || r == ';' {
			return '_'
		}
		return r
	}, "gorun: malformed PMI request, connection closed: "+err.Error())
	if len(msg) > MaxLine/2 {
		msg = msg[:MaxLine/2]
	}
	return msg
}

// serve answers rank's requests until EOF or Close. The first request must
// be init (MPICH sends it right after connecting). A malformed request
// (junk, an overlong line, a line that never ends) gets one error reply and
// ends the connection with an error naming the rank: the rank's next PMI
// call fails at once instead of waiting on a server that cannot follow it.
func (s *Server) serve(rank int, br *bufio.Reader, w io.Writer) error {
	log := s.log.With().Int("rank", rank).Logger()
	send := func(line string) error {
		_, err := io.WriteString(w, line)
		return err
	}
	malformed := func(err error) error {
		_ = send(formatLine("error", "rc", "-1", "msg", errorReply(err)))
		return fmt.Errorf("pmi: rank %d: %w", rank, err)
	}
	for {
		var line string
		err := s.readRequest(br, w, func() (err error) { line, err = readLine(br); return err })
		if err == nil {
			if strings.TrimSpace(line) == "" {
				continue // a blank line is harmless
			}
			if err = s.serveLine(rank, line, br, send, log); err == nil {
				continue
			}
			if errors.Is(err, errPMI2) {
				return s.serve2(rank, nil, br, w)
			}
		}
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
			return nil
		case errors.Is(err, ErrProtocol):
			return malformed(err)
		}
		return err
	}
}

// errPMI2 tells serve that the client switched to PMI-2.
var errPMI2 = errors.New("pmi: client switched to PMI-2")

// serveLine answers one PMI-1 request line. It returns errPMI2 once a
// PMI-2 client was answered, an ErrProtocol error for a malformed request
// (not yet answered), or a write error.
func (s *Server) serveLine(rank int, line string, br *bufio.Reader, send func(string) error, log zerolog.Logger) error {
	if strings.HasPrefix(line, "mcmd=") {
		// A multi-line spawn request: read to its end and refuse.
		if err := s.skipMulti(br); err != nil {
			return err
		}
		return send(formatLine("spawn_result", "rc", "-1", "errmsg", "gorun_does_not_spawn"))
	}
	m, err := parseLine(line)
	if err != nil {
		return err
	}
	log.Trace().Str("line", line).Msg("pmi request")
	if m.cmd == "init" && m.fields["pmi_version"] == "2" {
		// A PMI-2 client: answer in PMI-1 form, then framed
		// commands for the rest of the connection (pmi2.go).
		if err := send(formatLine("response_to_init", "pmi_version", "2", "pmi_subversion", "0", "rc", "0")); err != nil {
			return err
		}
		return errPMI2
	}
	reply, wait, err := s.handle(rank, m)
	if err != nil {
		log.Warn().Err(err).Str("line", line).Msg("PMI request refused")
	}
	if wait != nil {
		select {
		case <-wait:
		case <-s.done:
			return net.ErrClosed
		}
	}
	if reply != "" {
		if err := send(reply); err != nil {
			return err
		}
	}
	return nil
}

// skipMulti reads the lines of a multi-line command up to "endcmd".
func (s *Server) skipMulti(br *bufio.Reader) error {
	for {
		line, err := readLine(br)
		if err != nil {
			return err
		}
		if line == "endcmd" {
			return nil
		}
	}
}

// handle answers one request. It returns the reply line ("" for none), a
// channel to wait on before replying (a barrier), and an error for the log
// when the request was refused (the reply then says so to the client).
func (s *Server) handle(rank int, m message) (reply string, wait <-chan struct{}, err error) {
	rc := func(cmd string, e error, kv ...string) (string, <-chan struct{}, error) {
		if e != nil {
			return formatLine(cmd, append([]string{"rc", "-1", "msg", strings.ReplaceAll(e.Error(), " ", "_")}, kv...)...), nil, e
		}
		return formatLine(cmd, append([]string{"rc", "0", "msg", "success"}, kv...)...), nil, nil
	}
	switch m.cmd {
	case "init":
		if v := m.fields["pmi_version"]; v != "1" {
			return formatLine("response_to_init", "pmi_version", "1", "pmi_subversion", "1", "rc", "-1"), nil,
				fmt.Errorf("pmi: client asked for PMI version %s; gorun serves PMI-1 and PMI-2", v)
		}
		s.mu.Lock()
		s.ranks[rank].initialized = true
		s.mu.Unlock()
		return formatLine("response_to_init", "pmi_version", "1", "pmi_subversion", "1", "rc", "0"), nil, nil
	case "get_maxes":
		return formatLine("maxes", "kvsname_max", strconv.Itoa(KVSNameMax), "keylen_max", strconv.Itoa(KeylenMax),
			"vallen_max", strconv.Itoa(VallenMax), "rc", "0"), nil, nil
	case "get_appnum":
		return formatLine("appnum", "appnum", strconv.Itoa(s.cfg.AppNum), "rc", "0"), nil, nil
	case "get_my_kvsname":
		return formatLine("my_kvsname", "kvsname", s.cfg.KVSName, "rc", "0"), nil, nil
	case "get_universe_size":
		return formatLine("universe_size", "size", strconv.Itoa(s.cfg.Size), "rc", "0"), nil, nil
	case "put":
		return rc("put_result", s.put(m.fields["kvsname"], m.fields["key"], m.fields["value"]))
	case "get":
		v, err := s.get(m.fields["kvsname"], m.fields["key"])
		if errors.Is(err, errServerClosed) {
			return "", nil, nil // the connection is closing; no reply
		}
		if err != nil {
			return rc("get_result", err)
		}
		return rc("get_result", nil, "value", v)
	case "barrier_in":
		ch, err := s.enterBarrier(rank)
		if err != nil {
			return formatLine("barrier_out", "rc", "-1"), nil, err
		}
		return formatLine("barrier_out"), ch, nil
	case "finalize":
		s.mu.Lock()
		s.ranks[rank].finalized = true
		s.mu.Unlock()
		return formatLine("finalize_ack"), nil, nil
	case "abort":
		code, _ := strconv.Atoi(m.fields["exitcode"])
		s.request(Request{Kind: Abort, Rank: rank, Code: code, Message: m.fields["error_msg"]})
		// No reply: the client waits to be ended.
		return "", nil, nil
	case "publish_name", "unpublish_name", "lookup_name":
		return rc(strings.TrimSuffix(m.cmd, "_name")+"_result", errors.New("gorun does not serve name publishing"))
	}
	return formatLine(m.cmd+"_result", "rc", "-1", "msg", "unknown_command"), nil,
		fmt.Errorf("pmi: unknown command %q", m.cmd)
}

func (s *Server) put(kvs, key, value string) error { return s.putValue(kvs, key, value, true) }

// putValue stores a put. PMI-1 values travel as space-separated tokens
// (token); PMI-2 frames carry any byte but must stay within VallenMax.
func (s *Server) putValue(kvs, key, value string, token bool) error {
	switch {
	case kvs != s.cfg.KVSName:
		return fmt.Errorf("unknown kvsname %s", kvs)
	case !validToken(key, KeylenMax):
		return fmt.Errorf("bad key %q", key)
	case token && !validToken(value, VallenMax), !token && len(value) > VallenMax:
		return fmt.Errorf("bad value for key %s", key)
	case key == "PMI_process_mapping":
		return errors.New("PMI_process_mapping is reserved")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A later put of a key replaces it (MPICH never repeats a key; last
	// one wins keeps this simple and deterministic within a host).
	s.kvs[key] = value
	s.pending[key] = value
	return nil
}

func (s *Server) get(kvs, key string) (string, error) {
	if kvs != s.cfg.KVSName {
		return "", fmt.Errorf("unknown kvsname %s", kvs)
	}
	if key == "PMI_process_mapping" && s.cfg.ProcessMapping != "" {
		return s.cfg.ProcessMapping, nil
	}
	s.mu.Lock()
	if v, ok := s.kvs[key]; ok {
		s.mu.Unlock()
		return v, nil
	}
	// Before the first release nothing of another host is readable, so
	// there is nothing to ask for.
	if !s.cfg.Fetch || s.epoch == 0 || s.closed {
		s.mu.Unlock()
		return "", fmt.Errorf("key %s not found", key)
	}
	f := s.fetching[key]
	if f == nil {
		f = &fetch{done: make(chan struct{})}
		if !s.requestLocked(Request{Kind: Get, Key: key}) {
			s.mu.Unlock()
			return "", fmt.Errorf("key %s not found (its owner was not asked: requests queue full)", key)
		}
		s.fetching[key] = f
	}
	s.mu.Unlock()
	select {
	case <-f.done:
	case <-s.done:
		return "", errServerClosed
	}
	if !f.found {
		return "", fmt.Errorf("key %s not found", key)
	}
	return f.value, nil
}

// errServerClosed ends a connection whose rank waited on the owner when
// the server closed.
var errServerClosed = errors.New("pmi: server closed")

// Answer gives the owner's answer to a Get for key: its value, or found
// false when no host put it before the last barrier. A found value is kept
// for the host's other ranks. An answer for a key nobody asked for is an
// error and changes nothing.
func (s *Server) Answer(key, value string, found bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fetching[key]
	if f == nil {
		return fmt.Errorf("pmi: answer for key %q, which was not asked for", key)
	}
	delete(s.fetching, key)
	f.value, f.found = value, found
	if found {
		s.kvs[key] = value
	}
	close(f.done)
	return nil
}

// enterBarrier counts rank in and returns the channel that closes when the
// barrier is released. The last local rank in sends the host's Fence.
func (s *Server) enterBarrier(rank int) (<-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ranks[rank]
	if st.inBarrier {
		return nil, fmt.Errorf("pmi: rank %d entered barrier %d twice", rank, s.epoch)
	}
	st.inBarrier = true
	s.entered++
	ch := s.released
	if s.entered == len(s.ranks) {
		puts := s.pending
		s.pending = map[string]string{}
		s.requestLocked(Request{Kind: Fence, Epoch: s.epoch, Puts: puts})
	}
	return ch, nil
}

func (s *Server) request(r Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requestLocked(r)
}

// requestLocked queues r for the owner unless the server is closed. The
// channel's capacity covers every request that can be outstanding (see
// NewServer), so this never blocks with mu held; if a misbehaving client
// aborts twice, the extra request is dropped rather than blocking.
func (s *Server) requestLocked(r Request) bool {
	if s.closed {
		return false
	}
	select {
	case s.reqs <- r:
		return true
	default:
		s.log.Warn().Int("rank", r.Rank).Int("kind", int(r.Kind)).Msg("PMI request dropped: owner not keeping up")
		return false
	}
}

// Ranks returns the ranks this server serves, in order.
func (s *Server) Ranks() []int { return slices.Sorted(maps.Keys(s.ranks)) }
