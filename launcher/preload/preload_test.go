package preload

import (
	"os"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// A preloaded file is placed only when its content matches the offered
// hash, and a present file with the same content is recognised.
func TestPreloadPlace(t *testing.T) {
	dir := t.TempDir()
	src := dir + "/src.bin"
	if err := os.WriteFile(src, []byte("the program"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := NewSource(src, false)
	if err != nil {
		t.Fatal(err)
	}
	z, err := s.compressed()
	if err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	path, present, err := Place(s.Info, dest)
	if err != nil {
		t.Fatal(err)
	}
	if present || path != dest+"/src.bin" {
		t.Fatalf("Place = %q, %v before the transfer", path, present)
	}
	dec, _ := zstd.NewReader(nil)
	defer dec.Close()
	bad := s.Info
	bad.SHA256 = strings.Repeat("0", 64)
	if err := placeFile(dec, z, bad, path); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("placeFile with a wrong hash: %v", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("a damaged file was placed")
	}
	if err := placeFile(dec, z, s.Info, path); err != nil {
		t.Fatal(err)
	}
	if _, present, _ := Place(s.Info, dest); !present {
		t.Fatal("placed file not recognised as present")
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", st.Mode())
	}
}
