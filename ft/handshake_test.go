package ft

import (
	"testing"

	"github.com/gorun-hpc/gorun/internal/handshake"
)

// The service's proof for protocol 1 is pinned to a vector computed
// outside Go (HMAC-SHA256 over "service\x001\x00job-7\x002\x005\x00<nonceA>\x00
// <nonceB>\x00"): replicas and services of different builds must keep
// computing the same bytes; a change here is a new wireProto.
func TestServiceProofFixedVector(t *testing.T) {
	got, err := handshake.MAC([]byte("ft-key"), proofFields("service", "job-7", 2, 5,
		"00112233445566778899aabbccddeeff", "ffeeddccbbaa99887766554433221100")...)
	if want := "9d63a065b63fbeef0d4f04877e1af150d2c930587af5ae18be471e75113718fa"; err != nil || got != want {
		t.Fatalf("service proof = %q, %v; want %q", got, err, want)
	}
}
