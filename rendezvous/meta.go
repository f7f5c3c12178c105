package rendezvous

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Member is what a rank advertises about itself, as every other member sees
// it. It travels in memberlist's node metadata (≤ 512 bytes), so it holds
// only small fixed facts; anything larger would go through our own messages.
type Member struct {
	Rank       int
	WorldSize  int // the size this member was started with (checked equal)
	LocalRank  int
	JobID      string
	Generation uint64 // the world's generation (Config.Generation)
	Host       string // host label (Config.Host)
	DataAddr   string // data-plane host:port (Config.DataAddr)
	PID        int    // process id on Host, for error messages
	Addr       string // gossip address host:port (filled from memberlist, not meta)
}

// metaVersion is the first byte of the metadata: a member speaking another
// layout is refused with a clear error instead of being misread.
const metaVersion = 2

func (c *Config) meta() Member {
	return Member{
		Rank: c.Rank, WorldSize: c.WorldSize, LocalRank: c.LocalRank,
		JobID: c.JobID, Generation: c.Generation, Host: c.Host, DataAddr: c.DataAddr, PID: pid,
	}
}

// encodeMeta lays out version, then uvarints rank, size, local rank, pid,
// then length-prefixed job id, host and data address, then the uvarint
// generation.
func encodeMeta(m Member) []byte { return appendMeta(make([]byte, 0, metaSize(m)), m) }

// appendMeta appends encodeMeta(m) to b.
func appendMeta(b []byte, m Member) []byte {
	b = append(b, metaVersion)
	b = binary.AppendUvarint(b, uint64(m.Rank))
	b = binary.AppendUvarint(b, uint64(m.WorldSize))
	b = binary.AppendUvarint(b, uint64(m.LocalRank))
	b = binary.AppendUvarint(b, uint64(m.PID))
	for _, s := range [...]string{m.JobID, m.Host, m.DataAddr} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return binary.AppendUvarint(b, m.Generation)
}

// metaSize is len(encodeMeta(m)), without encoding it.
func metaSize(m Member) int {
	n := 1 + uvarintLen(uint64(m.Rank)) + uvarintLen(uint64(m.WorldSize)) +
		uvarintLen(uint64(m.LocalRank)) + uvarintLen(uint64(m.PID)) + uvarintLen(m.Generation)
	for _, s := range [...]string{m.JobID, m.Host, m.DataAddr} {
		n += uvarintLen(uint64(len(s))) + len(s)
	}
	return n
}

// uvarintLen is the length of v as a uvarint.
func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

var errBadMeta = errors.New("rendezvous: malformed member metadata")

func decodeMeta(b []byte) (Member, error) { return decodeMetaIn(b, nil) }

// interner shares the job id and host strings of a decoded world table
// among its entries: the table repeats them in every entry, and a copy
// each was most of an attached rank's table in memory. Entries of one
// host come together, so the last string of each kind is tried before the
// map. A nil interner makes a string per field; a checking one (check)
// makes none, for a pass that only validates.
type interner struct {
	m     map[string]string
	last  [2]string
	check bool
}

func newInterner() *interner { return &interner{m: map[string]string{}} }

// str returns raw as a string: field 0 is the job id, 1 the host, 2 the
// data address (never shared: one per rank).
func (in *interner) str(field int, raw []byte) string {
	switch {
	case in == nil:
		return string(raw)
	case in.check:
		return ""
	case field > 1:
		return string(raw)
	case in.last[field] == string(raw):
		return in.last[field]
	}
	s, ok := in.m[string(raw)]
	if !ok {
		s = string(raw)
		in.m[s] = s
	}
	in.last[field] = s
	return s
}

// decodeMetaIn is decodeMeta with its strings made by in.
func decodeMetaIn(b []byte, in *interner) (Member, error) {
	var m Member
	if len(b) == 0 || b[0] != metaVersion {
		if len(b) == 0 {
			return m, fmt.Errorf("%w: empty (not a gorun rank?)", errBadMeta)
		}
		return m, fmt.Errorf("%w: version %d, want %d", errBadMeta, b[0], metaVersion)
	}
	b = b[1:]
	var ints [4]int
	for i := range ints {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > math.MaxInt32 {
			// 32 bits: the member table stores them so (memberState).
			return m, errBadMeta
		}
		ints[i], b = int(v), b[n:]
	}
	var strs [3]string
	for i := range strs {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return m, errBadMeta
		}
		strs[i] = in.str(i, b[n:n+int(l)])
		b = b[n+int(l):]
	}
	m.Rank, m.WorldSize, m.LocalRank, m.PID = ints[0], ints[1], ints[2], ints[3]
	m.JobID, m.Host, m.DataAddr = strs[0], strs[1], strs[2]
	e, n := binary.Uvarint(b)
	if n <= 0 {
		return m, errBadMeta
	}
	m.Generation = e
	return m, nil
}

// DeriveKey returns a 32-byte key for purpose (e.g. "gorun comm hmac v1"),
// derived from the job secret with HKDF-SHA-256 and the job id as salt, so
// that ranks whose Configs hold the same Secret and JobID get the same key
// with no message exchanged; ConfigFromEnv gives every rank of a job those
// in each launch mode (gorun, torch style, srun). The key is only as secret
// as Secret: without GORUN_SECRET (torch style or srun outside gorun) the
// secret is derived from the job id and the seed (Config.SecretDerived),
// which anyone who can read them can repeat, so the key then authenticates
// nothing. It is a Config method,
// not a World one, because the data plane needs its key before Join: the
// data-plane address a rank advertises in Join must already be listening.
// Different purposes give independent keys; the gossip key's purpose and the
// empty purpose are refused.
func (c *Config) DeriveKey(purpose string) ([]byte, error) {
	if purpose == gossipPurpose || purpose == "" {
		return nil, fmt.Errorf("rendezvous: key purpose %q is reserved", purpose)
	}
	if len(c.Secret) == 0 {
		return nil, &ConfigError{Field: "Secret", Problem: "empty: no key can be derived"}
	}
	return hkdf.Key(sha256.New, c.Secret, []byte(c.JobID), purpose, 32)
}

// gossipPurpose is the HKDF purpose of the gossip key; DeriveKey refuses it
// so no other layer can end up with the gossip key by accident.
const gossipPurpose = "gorun rendezvous gossip v1"

// gossipKey derives memberlist's AES-256 key from the job secret. HKDF with a
// fixed purpose string keeps this key independent of any other key the job
// derives from the same secret (the data plane's HMAC key, for one), and the
// job id as salt makes two jobs that reuse a secret still use different keys.
func gossipKey(secret []byte, jobID string) ([]byte, error) {
	return hkdf.Key(sha256.New, secret, []byte(jobID), gossipPurpose, 32)
}
