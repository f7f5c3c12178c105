package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Per-user state on a host (the preload cache, ssh control sockets) lives
// only in directories this user owns with mode 0700, checked the way
// OpenSSH's StrictModes checks ~/.ssh: every directory from / down to the
// base must belong to root or this user and be writable by nobody else
// unless it is sticky (/tmp); the directories gorun makes below it must be
// real directories (never symlinks, checked with lstat), owned by this user,
// with no group or other bits. Another user then cannot create the tree
// first, swap a file in it, or redirect it with a symlink.

// PrivateDirError says why a directory is not private to this user.
type PrivateDirError struct {
	Path    string
	Problem string
}

func (e *PrivateDirError) Error() string {
	return fmt.Sprintf("launcher: %s is not private to this user: %s", e.Path, e.Problem)
}

// privateDir returns base/elems... after making sure every directory of it
// is private: base must be safe (secureBase), each element is created with
// mode 0700 or, when present, lstat-checked.
func privateDir(base string, elems ...string) (string, error) {
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
		return &PrivateDirError{dir, "it is a symbolic link"}
	}
	if !st.IsDir() {
		return &PrivateDirError{dir, "it is not a directory"}
	}
	if uid := int(st.Sys().(*syscall.Stat_t).Uid); uid != os.Getuid() {
		return &PrivateDirError{dir, "it belongs to uid " + strconv.Itoa(uid)}
	}
	if st.Mode().Perm()&0o077 != 0 {
		return &PrivateDirError{dir, fmt.Sprintf("its mode is %04o, want 0700", st.Mode().Perm())}
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
			return &PrivateDirError{base, fmt.Sprintf("%s belongs to uid %d", p, uid)}
		}
		if st.Mode().Perm()&0o022 != 0 && st.Mode()&os.ModeSticky == 0 {
			return &PrivateDirError{base, fmt.Sprintf("%s is writable by others (mode %04o) and not sticky", p, st.Mode().Perm())}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// userStateDir is this user's private directory for gorun's state of the
// given kind on this host: $XDG_RUNTIME_DIR/gorun/<kind> when the runtime
// directory is set and safe (systemd makes it per user, 0700, on tmpfs),
// else the user cache directory ($XDG_CACHE_HOME or ~/.cache)/gorun/<kind>,
// else $TMPDIR/gorun-<uid>/<kind>. Each candidate must pass privateDir;
// the first that does is used, and when none does the last error says why.
func userStateDir(kind string) (string, error) {
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
		dir, err := privateDir(b[0], b[1:]...)
		if err == nil {
			return dir, nil
		}
		last = err
	}
	return "", last
}
