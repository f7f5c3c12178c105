package privdir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Error says why a directory is not private to this user.
type Error struct {
	Path    string
	Problem string
}

func (e *Error) Error() string {
	return fmt.Sprintf("launcher: %s is not private to this user: %s", e.Path, e.Problem)
}

// Make returns base/elems... after making sure every directory of it
// is private: base must be safe (secureBase), each element is created with
// mode 0700 or, when present, lstat-checked.
func Make(base string, elems ...string) (string, error) {
	if err := secureBase(base); err != nil {
		return "", err
	}
	dir := base
	for _, e := range elems {
		dir = filepath.Join(dir, e)
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("launcher: create %s: %w", dir, err)
		}
		if err := checkOwnDir(dir); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// checkOwnDir: dir is a directory (not a symlink), owned by this user,
// mode 0700 or stricter.
func checkOwnDir(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if st.Mode()&os.ModeSymlink != 0 {
		return &Error{dir, "it is a symbolic link"}
	}
	if !st.IsDir() {
		return &Error{dir, "it is not a directory"}
	}
	if uid := int(st.Sys().(*syscall.Stat_t).Uid); uid != os.Getuid() {
		return &Error{dir, "it belongs to uid " + strconv.Itoa(uid)}
	}
	if st.Mode().Perm()&0o077 != 0 {
		return &Error{dir, fmt.Sprintf("its mode is %04o, want 0700", st.Mode().Perm())}
	}
	return nil
}

// secureBase checks base and each directory above it (after resolving
// symlinks, which only this user or root could have placed there once the
// chain checks out): owned by root or this user, and not writable by group
// or others unless sticky.
func secureBase(base string) error {
	real, err := filepath.EvalSymlinks(base)
	if err != nil {
		return err
	}
	for p := real; ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		uid := int(st.Sys().(*syscall.Stat_t).Uid)
		if uid != 0 && uid != os.Getuid() {
			return &Error{base, fmt.Sprintf("%s belongs to uid %d", p, uid)}
		}
		if st.Mode().Perm()&0o022 != 0 && st.Mode()&os.ModeSticky == 0 {
			return &Error{base, fmt.Sprintf("%s is writable by others (mode %04o) and not sticky", p, st.Mode().Perm())}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// UserState is this user's private directory for gorun's state of the
// given kind on this host: $XDG_RUNTIME_DIR/gorun/<kind> when the runtime
// directory is set and safe (systemd makes it per user, 0700, on tmpfs),
// else the user cache directory ($XDG_CACHE_HOME or ~/.cache)/gorun/<kind>,
// else $TMPDIR/gorun-<uid>/<kind>. Each candidate must pass Make;
// the first that does is used, and when none does the last error says why.
func UserState(kind string) (string, error) {
	var bases [][]string
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		bases = append(bases, []string{d, "gorun", kind})
	}
	if d, err := os.UserCacheDir(); err == nil && filepath.IsAbs(d) {
		if err := os.MkdirAll(d, 0o700); err == nil {
			bases = append(bases, []string{d, "gorun", kind})
		}
	}
	bases = append(bases, []string{os.TempDir(), "gorun-" + strconv.Itoa(os.Getuid()), kind})
	var last error
	for _, b := range bases {
		dir, err := Make(b[0], b[1:]...)
		if err == nil {
			return dir, nil
		}
		last = err
	}
	return "", last
}
