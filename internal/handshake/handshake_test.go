package handshake

import (
	"errors"
	"regexp"
	"testing"
)

// The vectors were computed outside Go (Python's hmac over the same
// NUL-terminated fields), so they pin the bytes both wire protocols send:
// the host agent's (role, job, host, nonceA, nonceB) and the quorum
// service's (role, protocol, job, replica, incarnation, nonceA, nonceB).
func TestMACFixedVectors(t *testing.T) {
	const nA, nB = "00112233445566778899aabbccddeeff", "ffeeddccbbaa99887766554433221100"
	for _, c := range []struct {
		name   string
		key    string
		fields []string
		want   string
	}{
		{"two fields", "k", []string{"a", "b"}, "e7b2a4b79cd6fb63db60115ffaf567adf2880bd7ab5a27152f0552f70166ca36"},
		{"host agent", "job-secret", []string{"gorun/3", "job-7", "node01", nA, nB}, "a586d32ec57bbdb8dca59fb44284dca8a602c1dd6c43fbbe93b411fc1dffe01e"},
		{"quorum service", "ft-key", []string{"service", "1", "job-7", "2", "5", nA, nB}, "9d63a065b63fbeef0d4f04877e1af150d2c930587af5ae18be471e75113718fa"},
	} {
		got, err := MAC([]byte(c.key), c.fields...)
		if err != nil || got != c.want {
			t.Errorf("%s: MAC = %q, %v; want %q", c.name, got, err, c.want)
		}
		if !Verify([]byte(c.key), c.want, c.fields...) {
			t.Errorf("%s: Verify refused the known MAC", c.name)
		}
	}
}

// Every field boundary, count and key is bound: lists that concatenate to
// the same bytes, or differ only in an empty field, must not share a MAC.
func TestMACBindsBoundaries(t *testing.T) {
	key := []byte("k")
	lists := [][]string{
		{"ab", "c"}, {"a", "bc"}, {"abc"}, {"abc", ""}, {"", "abc"}, {"a", "b", "c"}, {},
	}
	seen := map[string]int{}
	for i, l := range lists {
		m, err := MAC(key, l...)
		if err != nil {
			t.Fatalf("MAC(%q): %v", l, err)
		}
		if j, dup := seen[m]; dup {
			t.Errorf("MAC(%q) == MAC(%q)", l, lists[j])
		}
		seen[m] = i
		if Verify(key, m, "ab", "c") != (i == 0) {
			t.Errorf("Verify(MAC(%q)) against (\"ab\", \"c\") = %v", l, i != 0)
		}
	}
	a, _ := MAC([]byte("k1"), "x")
	b, _ := MAC([]byte("k2"), "x")
	if a == b {
		t.Error("two keys gave one MAC")
	}
}

func TestMACRefusesNUL(t *testing.T) {
	_, err := MAC([]byte("k"), "a", "b\x00c")
	if !errors.Is(err, ErrField) {
		t.Fatalf("MAC with a NUL in field 2: err = %v, want ErrField", err)
	}
	if want := "handshake: field holds a NUL byte (field 2 of 2)"; err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	// "a\x00b","c" and "a","b\x00c" would hash the same bytes as
	// "a","b","c"; Verify must not accept that MAC for either.
	m, _ := MAC([]byte("k"), "a", "b", "c")
	if Verify([]byte("k"), m, "a\x00b", "c") || Verify([]byte("k"), m, "a", "b\x00c") {
		t.Error("Verify accepted a MAC for fields holding NUL")
	}
}

func TestNonce(t *testing.T) {
	hex := regexp.MustCompile(`^[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for range 64 {
		n := Nonce()
		if !hex.MatchString(n) {
			t.Fatalf("nonce %q is not %d hex-encoded bytes", n, NonceBytes)
		}
		if seen[n] {
			t.Fatalf("nonce %q repeated", n)
		}
		seen[n] = true
	}
}
