package privdir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Make makes missing levels 0700 and refuses a level that another
// user could have prepared: too open, a symlink, not a directory, or
// (as root) owned by someone else; and a base under a directory that
// anyone may write without the sticky bit.
func TestMake(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, base string) // makes base/gorun in some state
		ok      bool
	}{
		{"fresh", func(*testing.T, string) {}, true},
		{"already private", func(t *testing.T, b string) { must(t, os.Mkdir(b+"/gorun", 0o700)) }, true},
		{"world-writable", func(t *testing.T, b string) {
			must(t, os.Mkdir(b+"/gorun", 0o700))
			must(t, os.Chmod(b+"/gorun", 0o777))
		}, false},
		{"group-readable", func(t *testing.T, b string) { must(t, os.Mkdir(b+"/gorun", 0o750)) }, false},
		{"symlink to a private dir", func(t *testing.T, b string) {
			must(t, os.Mkdir(b+"/elsewhere", 0o700))
			must(t, os.Symlink(b+"/elsewhere", b+"/gorun"))
		}, false},
		{"a file", func(t *testing.T, b string) { must(t, os.WriteFile(b+"/gorun", nil, 0o600)) }, false},
		{"another user's", func(t *testing.T, b string) {
			if os.Getuid() != 0 {
				t.Skip("needs root to chown")
			}
			must(t, os.Mkdir(b+"/gorun", 0o700))
			must(t, os.Chown(b+"/gorun", 65534, 65534))
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			tc.prepare(t, base)
			dir, err := Make(base, "gorun", "preload")
			if !tc.ok {
				var pe *Error
				if !errors.As(err, &pe) {
					t.Fatalf("Make = %q, %v; want a *Error", dir, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range []string{filepath.Join(base, "gorun"), dir} {
				if st, err := os.Lstat(d); err != nil || st.Mode().Perm() != 0o700 || !st.IsDir() {
					t.Errorf("%s: %v %v, want a 0700 directory", d, st.Mode(), err)
				}
			}
		})
	}
	// A base inside a world-writable, non-sticky directory is refused.
	open := t.TempDir()
	must(t, os.Chmod(open, 0o777))
	if _, err := Make(open, "gorun"); err == nil {
		t.Error("a base in a world-writable non-sticky directory was accepted")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
