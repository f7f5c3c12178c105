package program

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Error reports a program that cannot be run, found before any rank
// starts.
type Error struct {
	// Program is the name as given.
	Program string
	// Err says why: not found, not executable, a directory.
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("launcher: cannot run %s: %v", e.Program, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ExitCode is 127, like a shell for a missing or unusable command.
func (e *Error) ExitCode() int { return 127 }

// Resolve finds the executable for name the way a shell does: a name
// with a slash is a path (relative to dir when dir is set), other names are
// looked up in PATH. Anything that could not be executed is an *Error,
// found before any rank starts.
func Resolve(name, dir string) (string, error) {
	if name == "" {
		return "", &Error{Program: name, Err: errors.New("empty program name")}
	}
	if !IsPath(name) {
		p, err := exec.LookPath(name)
		if err != nil {
			return "", &Error{Program: name, Err: errors.New("command not found in PATH")}
		}
		return p, nil
	}
	p := name
	if dir != "" && !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	st, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", &Error{Program: name, Err: errors.New("no such file")}
	case err != nil:
		return "", &Error{Program: name, Err: err}
	case st.IsDir():
		return "", &Error{Program: name, Err: errors.New("is a directory")}
	case unix.Access(p, unix.X_OK) != nil || st.Mode()&0o111 == 0:
		return "", &Error{Program: name, Err: errors.New("permission denied (not executable)")}
	}
	return p, nil
}

// IsPath reports whether name is a path rather than a name to look up in
// PATH: whether it has a slash, as a shell decides.
func IsPath(name string) bool { return strings.IndexByte(name, '/') >= 0 }
