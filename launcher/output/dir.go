package output

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// --output-dir is a directory the user names, often in a shared place
// (/tmp, a project directory), and gorun may run as root. Another user who
// can write there must not make gorun write through a link of theirs or
// into a file of theirs, and must not be able to replace the logs: gorun
// refuses, with an error that names the path, an output directory
//
//   - reached through a symlink that belongs to another user (anyone may
//     link to anything; following it would write where they chose),
//   - that belongs to another user (they could replace the logs), or that
//     every user may write and is not sticky;
//
// and opens each log without following a symlink, then checks what it
// opened: a regular file of this user with one link (a hard link of
// another file would write into that file). Only then is it truncated. A
// symlink of the user's own is followed (openOwnLink); another user's is
// refused. The flight directory inside it is made the same way
// (OwnSubdir).

// DirError says why gorun will not write rank logs at Path.
type DirError struct {
	// Path is the directory or link refused; Problem says why, as the end
	// of a sentence that begins with Path ("belongs to uid 1001").
	Path    string
	Problem string
}

func (e *DirError) Error() string {
	return fmt.Sprintf("launcher: output dir: %s %s; gorun does not write there (choose a directory of your own)", e.Path, e.Problem)
}

// checkDir checks dir as the comment above says; dir exists.
func checkDir(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	// Every existing component of the path as written: a symlink must be
	// this user's or root's.
	p := string(filepath.Separator)
	for _, part := range strings.Split(abs, string(filepath.Separator)) {
		if part == "" {
			continue
		}
		p = filepath.Join(p, part)
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if st.Mode()&os.ModeSymlink != 0 {
			if uid := int(st.Sys().(*syscall.Stat_t).Uid); uid != 0 && uid != os.Getuid() {
				return &DirError{dir, fmt.Sprintf("is reached through %s, a symbolic link of uid %d", p, uid)}
			}
		}
	}
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return &DirError{dir, "is not a directory"}
	}
	if uid := int(st.Sys().(*syscall.Stat_t).Uid); uid != 0 && uid != os.Getuid() {
		return &DirError{dir, "belongs to uid " + strconv.Itoa(uid)}
	}
	if st.Mode().Perm()&0o002 != 0 && st.Mode()&os.ModeSticky == 0 {
		return &DirError{dir, fmt.Sprintf("is writable by every user and not sticky (mode %04o)", st.Mode().Perm())}
	}
	return nil
}

// openRankLog opens path for a rank's log: created if absent, never through
// a symlink, and only if it is a regular file of this user with one link;
// truncated unless appending.
func openRankLog(path string, appending bool) (*os.File, error) {
	// O_NONBLOCK keeps a FIFO planted in place of the log from blocking
	// the open (it fails with ENXIO); regular files ignore it.
	flags := os.O_WRONLY | os.O_CREATE | syscall.O_NOFOLLOW | syscall.O_NONBLOCK
	if appending {
		flags |= os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o666)
	if errors.Is(err, syscall.ELOOP) {
		return openOwnLink(path, flags&^syscall.O_NOFOLLOW, appending)
	}
	if err != nil {
		return nil, fmt.Errorf("launcher: output dir: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("launcher: output dir: %w", err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.Mode().IsRegular():
		err = &DirError{path, "is not a regular file"}
	case int(sys.Uid) != os.Getuid():
		err = &DirError{path, "belongs to uid " + strconv.Itoa(int(sys.Uid))}
	case sys.Nlink != 1:
		err = &DirError{path, fmt.Sprintf("has %d hard links (another file's contents)", sys.Nlink)}
	}
	if err == nil && !appending {
		err = f.Truncate(0)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openOwnLink opens the log at path through a symlink of this user's own
// (a log pointed at /dev/null, or elsewhere, on purpose): where it points
// is the user's choice, so what it opens is not checked, only that the
// link is this user's before and after the open (another user's link is
// refused: following it would write where they chose).
func openOwnLink(path string, flags int, appending bool) (*os.File, error) {
	before, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("launcher: output dir: %w", err)
	}
	if uid := int(before.Sys().(*syscall.Stat_t).Uid); uid != os.Getuid() {
		return nil, &DirError{path, "is a symbolic link of uid " + strconv.Itoa(uid)}
	}
	f, err := os.OpenFile(path, flags, 0o666)
	if err != nil {
		return nil, fmt.Errorf("launcher: output dir: %w", err)
	}
	after, err := os.Lstat(path)
	if err != nil || !os.SameFile(before, after) {
		f.Close()
		return nil, &DirError{path, "was replaced while it was opened"}
	}
	if !appending {
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			_ = f.Truncate(0)
		}
	}
	return f, nil
}

// OwnSubdir makes dir (inside a checked output directory, such as the
// flight records' directory) or accepts it when it is already a real
// directory of this user, never a symlink; otherwise it returns a
// *DirError.
func OwnSubdir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	switch {
	case st.Mode()&os.ModeSymlink != 0:
		return &DirError{dir, "is a symbolic link"}
	case !st.IsDir():
		return &DirError{dir, "is not a directory"}
	case int(st.Sys().(*syscall.Stat_t).Uid) != os.Getuid():
		return &DirError{dir, "belongs to uid " + strconv.Itoa(int(st.Sys().(*syscall.Stat_t).Uid))}
	}
	return nil
}
