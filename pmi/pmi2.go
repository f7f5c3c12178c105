package pmi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// PMI-2, the protocol of MPICH builds configured for it and of Slurm's
// libpmi2 (what `srun --mpi=pmi2` programs link). A PMI-2 client starts on
// the same descriptor with a PMI-1 line, "cmd=init pmi_version=2
// pmi_subversion=0", and once the server answered with version 2 both
// sides switch to framed commands:
//
//	"34    cmd=kvs-put;key=k;value=v;;w;"
//
// a 6-byte length field (decimal, left-aligned, space-padded) and then
// that many bytes of key=value pairs, each ended by ';', "cmd" first; a ';'
// inside a value is doubled. A reply is framed the same way and named after
// the request ("kvs-put-response"); a client that sends thrid= gets it
// back. kvs-fence is the job-wide barrier (the same Fence/Release as
// PMI-1's barrier_in), info-putnodeattr/info-getnodeattr are a store shared
// by the ranks of one host only (a get may wait for the put), and
// info-getjobattr answers PMI_process_mapping and universeSize.

// frameLenSize is the length field of a PMI-2 frame; maxFrame2 bounds a
// frame as the client does (64 KiB).
const (
	frameLenSize = 6
	maxFrame2    = 64 << 10
)

// pair is one key=value of a PMI-2 command, in order.
type pair struct{ k, v string }

// readFrame2 reads one PMI-2 frame and returns its pairs, "cmd" first.
func readFrame2(br *bufio.Reader) ([]pair, error) {
	var hdr [frameLenSize]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(hdr[:])))
	if err != nil || n <= 0 || n > maxFrame2 {
		return nil, fmt.Errorf("%w: PMI-2 length field %q", ErrProtocol, hdr[:])
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, err
	}
	ps, err := parseFrame2(string(body))
	if err != nil {
		return nil, err
	}
	if len(ps) == 0 || ps[0].k != "cmd" {
		return nil, fmt.Errorf("%w: PMI-2 command %q does not start with cmd=", ErrProtocol, body)
	}
	return ps, nil
}

// parseFrame2 splits "k=v;k=v;" with ";;" standing for a ';' in a value.
func parseFrame2(body string) ([]pair, error) {
	var ps []pair
	for i := 0; i < len(body); {
		eq := strings.IndexByte(body[i:], '=')
		if eq <= 0 {
			return nil, fmt.Errorf("%w: PMI-2 pair without key at %q", ErrProtocol, body[i:])
		}
		k := body[i : i+eq]
		i += eq + 1
		var v strings.Builder
		for {
			if i >= len(body) {
				return nil, fmt.Errorf("%w: PMI-2 value of %s not ended by ';'", ErrProtocol, k)
			}
			if body[i] == ';' {
				if i+1 < len(body) && body[i+1] == ';' {
					v.WriteByte(';')
					i += 2
					continue
				}
				i++
				break
			}
			v.WriteByte(body[i])
			i++
		}
		ps = append(ps, pair{k, v.String()})
	}
	return ps, nil
}

// formatFrame2 builds one framed command from key/value pairs.
func formatFrame2(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString(kv[i])
		b.WriteByte('=')
		b.WriteString(strings.ReplaceAll(kv[i+1], ";", ";;"))
		b.WriteByte(';')
	}
	body := b.String()
	l := strconv.Itoa(len(body))
	return l + strings.Repeat(" ", frameLenSize-len(l)) + body
}

func lookup2(ps []pair, k string) (string, bool) {
	for _, p := range ps {
		if p.k == k {
			return p.v, true
		}
	}
	return "", false
}

// serve2 answers a PMI-2 client until EOF or Close. rank is the client's
// rank, or -1 when only the fullinit's pmirank (a PMI_ID, port mode) can
// tell; resolve maps that id to the rank and binds it.
//
// long: one switch over the PMI-2 wire commands, each case a few lines
// that build its reply; split up, a reader would hop between a dozen
// functions to see what one connection can be asked.
func (s *Server) serve2(rank int, resolve func(id string) (int, error), br *bufio.Reader, w io.Writer) error {
	log := s.log.With().Int("rank", rank).Logger()
	for {
		var ps []pair
		err := s.readRequest(br, w, func() (err error) { ps, err = readFrame2(br); return err })
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			if errors.Is(err, ErrProtocol) {
				// Junk: one framed error reply, then the connection
				// closes (see serve).
				_, _ = io.WriteString(w, formatFrame2("cmd", "error", "rc", "-1", "errmsg", errorReply(err)))
				return fmt.Errorf("pmi: rank %d: %w", rank, err)
			}
			return err
		}
		cmd := ps[0].v
		if rank < 0 && cmd != "fullinit" {
			return fmt.Errorf("%w: PMI-2 %s before fullinit on a port connection", ErrProtocol, cmd)
		}
		reply := []string{"cmd", cmd + "-response"}
		if t, ok := lookup2(ps, "thrid"); ok {
			reply = append(reply, "thrid", t)
		}
		arg := func(k string) string { v, _ := lookup2(ps, k); return v }
		ok := func(kv ...string) []string { return append(append(reply, "rc", "0"), kv...) }
		fail := func(e error) []string {
			log.Warn().Err(e).Str("cmd", cmd).Msg("PMI-2 request refused")
			return append(reply, "rc", "-1", "errmsg", e.Error())
		}
		var out []string
		switch cmd {
		case "fullinit":
			if rank < 0 {
				// MPICH's client names itself with pmirank=PMI_ID,
				// Slurm's libpmi2 with srcid=PMI_ID.
				id, has := lookup2(ps, "pmirank")
				if !has {
					id = arg("srcid")
				}
				if rank, err = resolve(id); err != nil {
					return err
				}
				log = s.log.With().Int("rank", rank).Logger()
			}
			s.mu.Lock()
			s.ranks[rank].initialized = true
			s.mu.Unlock()
			out = ok("pmi-version", "2", "pmi-subversion", "0", "rank", strconv.Itoa(rank),
				"size", strconv.Itoa(s.cfg.Size), "appnum", strconv.Itoa(s.cfg.AppNum),
				"debugged", "FALSE", "pmiverbose", "FALSE")
		case "job-getid":
			out = ok("jobid", s.cfg.KVSName)
		case "kvs-put":
			if err := s.putValue(s.cfg.KVSName, arg("key"), arg("value"), false); err != nil {
				out = fail(err)
			} else {
				out = ok()
			}
		case "kvs-fence":
			ch, err := s.enterBarrier(rank)
			if err != nil {
				out = fail(err)
				break
			}
			select {
			case <-ch:
			case <-s.done:
				return nil
			}
			out = ok()
		case "kvs-get":
			if v, err := s.get(s.cfg.KVSName, arg("key")); errors.Is(err, errServerClosed) {
				return nil
			} else if err != nil {
				out = ok("found", "FALSE")
			} else {
				out = ok("found", "TRUE", "value", v)
			}
		case "info-putnodeattr":
			s.putNodeAttr(arg("key"), arg("value"))
			out = ok()
		case "info-getnodeattr":
			v, found, closed := s.getNodeAttr(arg("key"), arg("wait") == "TRUE")
			if closed {
				return nil
			}
			if found {
				out = ok("found", "TRUE", "value", v)
			} else {
				out = ok("found", "FALSE")
			}
		case "info-getjobattr":
			switch arg("key") {
			case "PMI_process_mapping":
				if s.cfg.ProcessMapping != "" {
					out = ok("found", "TRUE", "value", s.cfg.ProcessMapping)
				} else {
					out = ok("found", "FALSE")
				}
			case "universeSize":
				out = ok("found", "TRUE", "value", strconv.Itoa(s.cfg.Size))
			default:
				out = ok("found", "FALSE")
			}
		case "finalize":
			s.mu.Lock()
			s.ranks[rank].finalized = true
			s.mu.Unlock()
			out = ok()
		case "abort":
			// PMI-2's abort carries a message, no code: the job ends
			// with code 1, as a failed rank's would.
			s.request(Request{Kind: Abort, Rank: rank, Code: 1, Message: arg("msg")})
			continue
		default:
			out = fail(fmt.Errorf("gorun does not serve %s", cmd))
		}
		if _, err := io.WriteString(w, formatFrame2(out...)); err != nil {
			return err
		}
	}
}

// putNodeAttr stores a host-local attribute and wakes every rank waiting
// for one.
func (s *Server) putNodeAttr(k, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodeAttrs == nil {
		s.nodeAttrs = map[string]string{}
	}
	s.nodeAttrs[k] = v
	if s.attrChanged != nil {
		close(s.attrChanged)
		s.attrChanged = nil
	}
}

// getNodeAttr returns a host-local attribute; with wait it blocks until a
// rank of this host put it (closed is then true if the server closed
// first).
func (s *Server) getNodeAttr(k string, wait bool) (v string, found, closed bool) {
	for {
		s.mu.Lock()
		v, found = s.nodeAttrs[k]
		if found || !wait {
			s.mu.Unlock()
			return v, found, false
		}
		if s.attrChanged == nil {
			s.attrChanged = make(chan struct{})
		}
		ch := s.attrChanged
		s.mu.Unlock()
		select {
		case <-ch:
		case <-s.done:
			return "", false, true
		}
	}
}
