package pmi

import (
	"errors"
	"fmt"
	"strings"
)

// The PMI-1 "simple" wire format, as MPICH's client (src/pmi/simple) writes
// and reads it:
//
//	client → server   cmd=put kvsname=kvs_1 key=k value=v\n
//	server → client   cmd=put_result rc=0 msg=success\n
//
// A message is one line of space-separated key=value tokens, "cmd" first.
// Values cannot hold spaces or newlines (MPICH encodes its binary business
// cards), and the client reads at most MaxLine bytes per line, so replies
// are bounded by the maxima the server announces in "maxes".

// Limits announced to clients in the "maxes" reply. They are the values
// MPICH's own process manager (Hydra) announces; the client shrinks
// VallenMax itself so that a put line fits in its 1024-byte buffer.
const (
	// MaxLine is the client's line buffer (PMIU_MAXLINE); a longer line is
	// a protocol error.
	MaxLine    = 1024
	KVSNameMax = 256
	KeylenMax  = 64
	VallenMax  = 1024
)

// ErrProtocol is the sentinel wrapped by every malformed-message error.
var ErrProtocol = errors.New("pmi: protocol error")

// message is one parsed line: its command and its other fields.
type message struct {
	cmd    string
	fields map[string]string
}

// parseLine parses one line (without its newline). The first token must be
// cmd=NAME; a token without '=' is a protocol error naming it.
func parseLine(line string) (message, error) {
	toks := strings.Fields(line)
	if len(toks) == 0 {
		return message{}, fmt.Errorf("%w: empty line", ErrProtocol)
	}
	m := message{fields: make(map[string]string, len(toks)-1)}
	for i, t := range toks {
		k, v, ok := strings.Cut(t, "=")
		if !ok || k == "" {
			return message{}, fmt.Errorf("%w: token %q in %q is not key=value", ErrProtocol, t, line)
		}
		if i == 0 {
			if k != "cmd" {
				return message{}, fmt.Errorf("%w: line %q does not start with cmd=", ErrProtocol, line)
			}
			m.cmd = v
			continue
		}
		m.fields[k] = v
	}
	return m, nil
}

// formatLine writes cmd and the key/value pairs (in the order given) as one
// line with its newline.
func formatLine(cmd string, kv ...string) string {
	var b strings.Builder
	b.WriteString("cmd=")
	b.WriteString(cmd)
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteByte(' ')
		b.WriteString(kv[i])
		b.WriteByte('=')
		b.WriteString(kv[i+1])
	}
	b.WriteByte('\n')
	return b.String()
}

// validToken reports whether s can travel as a key or value: no space,
// no newline, not empty, and within limit bytes.
func validToken(s string, limit int) bool {
	return s != "" && len(s) <= limit && !strings.ContainsAny(s, " \t\n\r")
}
