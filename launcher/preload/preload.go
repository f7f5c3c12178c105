package preload

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/klauspost/compress/zstd"

	"github.com/gorun-hpc/gorun/launcher/privdir"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// Source is a file on gorun's side with its compressed bytes,
// made once and shared by every host's sender.
type Source struct {
	path string
	// Info is what the hosts are told of the file (name, size, mode,
	// SHA-256, whether it is the program).
	Info wire.PreloadFile
	once sync.Once
	zst  []byte
	err  error
}

// NewSource reads the file at path (the job's program when program is
// set) and hashes it; it is compressed when a host first needs it.
func NewSource(path string, program bool) (*Source, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("launcher: preload %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("launcher: preload %s: not a regular file", path)
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, fmt.Errorf("launcher: preload %s: %w", path, err)
	}
	return &Source{path: path, Info: wire.PreloadFile{
		Name: filepath.Base(path), Size: n, SHA256: hex.EncodeToString(h.Sum(nil)), Mode: st.Mode().Perm(), Program: program,
	}}, nil
}

func (s *Source) compressed() ([]byte, error) {
	s.once.Do(func() {
		data, err := os.ReadFile(s.path)
		if err != nil {
			s.err = err
			return
		}
		if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != s.Info.SHA256 {
			s.err = fmt.Errorf("%s changed while gorun was starting", s.path)
			return
		}
		enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if err != nil {
			s.err = err
			return
		}
		s.zst = enc.EncodeAll(data, nil)
		enc.Close()
	})
	return s.zst, s.err
}

// chunk is the size of one data frame.
const chunk = 1 << 20

// Send sends every file the agent asked for (need holds SHA-256s)
// and waits for its verdict on each.
func Send(w *wire.Conn, srcs []*Source, need []string) error {
	for _, sha := range need {
		var src *Source
		for _, s := range srcs {
			if s.Info.SHA256 == sha {
				src = s
			}
		}
		if src == nil {
			return fmt.Errorf("agent asked for unknown file %s", sha)
		}
		z, err := src.compressed()
		if err != nil {
			return err
		}
		hdr, _ := json.Marshal(wire.Msg{T: "file", File: &wire.FileHeader{SHA256: sha, Compressed: len(z)}})
		if err := w.WriteFrame(wire.FrameMsg, hdr); err != nil {
			return err
		}
		for off := 0; off < len(z); off += chunk {
			if err := w.WriteFrame(wire.FrameData, z[off:min(off+chunk, len(z))]); err != nil {
				return err
			}
		}
		m, err := w.ReadMsg()
		if err != nil {
			return err
		}
		if m.T != "file-ok" {
			return fmt.Errorf("%s: %s", src.Info.Name, m.Err)
		}
	}
	return nil
}

// Place is where a host keeps a preloaded file and whether it is
// already there with the right content. The program's place must be
// private to this user; when no private directory can be had the error
// says why and the agent reports it as this host's failure.
func Place(f wire.PreloadFile, dir string) (path string, present bool, err error) {
	if f.Program {
		cache, err := privdir.UserState("preload")
		if err != nil {
			return "", false, err
		}
		d, err := privdir.Make(cache, f.SHA256)
		if err != nil {
			return "", false, err
		}
		path = filepath.Join(d, f.Name)
	} else {
		if err := checkDir(dir); err != nil {
			return "", false, err
		}
		path = filepath.Join(dir, f.Name)
	}
	// A file already there counts only when it is this user's own (see
	// fileSHA256): another user's copy with the right hash could be
	// rewritten by its owner once checked, so it is replaced instead.
	got, err := fileSHA256(path, true)
	return path, err == nil && got == f.SHA256, nil
}

// checkDir refuses a ranks' working directory where another user
// could replace the preloaded files after they were placed: one that
// belongs to another user, or that every user may write and is not sticky.
func checkDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if uid := int(st.Sys().(*syscall.Stat_t).Uid); uid != 0 && uid != os.Getuid() {
		return &privdir.Error{Path: dir, Problem: fmt.Sprintf("it belongs to uid %d, who could replace the preloaded files (run from a directory of your own)", uid)}
	}
	if st.Mode().Perm()&0o002 != 0 && st.Mode()&os.ModeSticky == 0 {
		return &privdir.Error{Path: dir, Problem: fmt.Sprintf("every user may write it (mode %04o, not sticky) and replace the preloaded files", st.Mode().Perm())}
	}
	return nil
}

// fileSHA256 hashes path through one descriptor. For a cached program
// (own) it must be a regular file, reached without following a symlink,
// owned by this user and writable by nobody else.
func fileSHA256(path string, own bool) (string, error) {
	flags := os.O_RDONLY
	if own {
		flags |= syscall.O_NOFOLLOW
	}
	fh, err := os.OpenFile(path, flags, 0)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	if own {
		st, err := fh.Stat()
		if err != nil {
			return "", err
		}
		if !st.Mode().IsRegular() || int(st.Sys().(*syscall.Stat_t).Uid) != os.Getuid() || st.Mode().Perm()&0o022 != 0 {
			return "", &privdir.Error{Path: path, Problem: "a cached program must be a regular file of this user that nobody else can write"}
		}
	}
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Receive is the agent side: for each needed file, read its data
// frames, decompress, check the hash, place it atomically, and answer.
func Receive(w *wire.Conn, files []wire.PreloadFile, paths map[string]string, need []string) error {
	byHash := map[string]wire.PreloadFile{}
	for _, f := range files {
		byHash[f.SHA256] = f
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return err
	}
	defer dec.Close()
	for range need {
		m, err := w.ReadMsg()
		if err != nil {
			return err
		}
		if m.T != "file" || m.File == nil {
			return fmt.Errorf("expected a file, got %q", m.T)
		}
		f, ok := byHash[m.File.SHA256]
		if !ok {
			return fmt.Errorf("unexpected file %s", m.File.SHA256)
		}
		z := make([]byte, 0, m.File.Compressed)
		for len(z) < m.File.Compressed {
			typ, p, err := w.ReadFrame(nil)
			if err != nil {
				return err
			}
			if typ != wire.FrameData {
				return fmt.Errorf("expected file data, got frame %q", typ)
			}
			z = append(z, p...)
		}
		verr := placeFile(dec, z, f, paths[f.SHA256])
		reply := wire.Msg{T: "file-ok"}
		if verr != nil {
			reply = wire.Msg{T: "file-bad", Err: verr.Error()}
		}
		if err := w.Send(reply); err != nil {
			return err
		}
		if verr != nil {
			return verr
		}
	}
	return nil
}

func placeFile(dec *zstd.Decoder, z []byte, f wire.PreloadFile, path string) error {
	data, err := dec.DecodeAll(z, make([]byte, 0, f.Size))
	if err != nil {
		return fmt.Errorf("decompress %s: %w", f.Name, err)
	}
	if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != f.SHA256 || int64(len(data)) != f.Size {
		return fmt.Errorf("%s arrived damaged (hash mismatch)", f.Name)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+f.Name+".*")
	if err != nil {
		return err
	}
	_, err = io.Copy(tmp, bytes.NewReader(data))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), f.Mode)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
