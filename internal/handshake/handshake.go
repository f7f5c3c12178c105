// Package handshake holds the proof that opens gorun's authenticated
// connections: a host agent dialling gorun (launcher) and a replica
// dialling the quorum service (ft) each exchange fresh nonces and then
// HMACs over the connection's fields, so that neither side can be posed
// as, nor an old exchange replayed, without the key.
//
// It owns the MAC's construction and the nonces, nothing else: the
// greeting lines, their fields, the keys and what a refusal says belong to
// the protocols that use it. Both protocols' bytes on the wire are fixed by
// this package (tests pin them to known vectors), so a change here is a
// change of both wire protocols.
package handshake

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// ErrField is a field that cannot be bound into a MAC: it holds the NUL
// byte that separates fields, so two different field lists could encode
// to the same bytes ("a\x00b","c" and "a","b\x00c").
var ErrField = errors.New("handshake: field holds a NUL byte")

// NonceBytes is how many random bytes a nonce carries (it is sent as
// twice as many hex digits).
const NonceBytes = 16

// Nonce returns a fresh random nonce from crypto/rand, hex-encoded. Safe
// for concurrent use.
func Nonce() string {
	var b [NonceBytes]byte
	// crypto/rand.Read never fails (it aborts the process rather than
	// return short), so its error needs no path here.
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// MAC returns the hex HMAC-SHA256 keyed with key over fields, each field
// followed by a NUL byte: the terminator keeps field boundaries in the
// hashed bytes, so ("ab","c") and ("a","bc") get different MACs. A field
// holding a NUL byte is refused with ErrField (which field is named),
// since it would make that boundary ambiguous.
func MAC(key []byte, fields ...string) (string, error) {
	m := hmac.New(sha256.New, key)
	for i, f := range fields {
		if strings.IndexByte(f, 0) >= 0 {
			return "", fmt.Errorf("%w (field %d of %d)", ErrField, i+1, len(fields))
		}
		m.Write([]byte(f))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil)), nil
}

// Verify reports whether proof is MAC(key, fields...), comparing in
// constant time. A field MAC refuses makes every proof false.
func Verify(key []byte, proof string, fields ...string) bool {
	want, err := MAC(key, fields...)
	if err != nil {
		return false
	}
	return hmac.Equal([]byte(proof), []byte(want))
}
