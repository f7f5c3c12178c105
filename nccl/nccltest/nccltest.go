// Package nccltest builds the stand-in NCCL and CUDA driver libraries that
// gorun's tests load in place of the real ones, which cannot load on
// machines without an NVIDIA GPU and driver (Debian 12 has no NCCL at all).
//
// The C sources live in csrc/ and are compiled with the system C compiler
// (gcc, or $CC) into a directory the caller owns, as libcuda.so.1 and
// libnccl.so.2 with their real sonames, so that loading them by name with
// LD_LIBRARY_PATH set, or by path, exercises exactly the loader code a GPU
// host runs. What the stand-ins do and do not model is written at the top of
// csrc/cuda.c and csrc/nccl.c.
package nccltest

import (
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

//go:embed csrc/*.c csrc/*.h
var sources embed.FS

// Libraries names the built stand-ins.
type Libraries struct {
	Dir  string // holds both; put it on LD_LIBRARY_PATH for child processes
	NCCL string // Dir/libnccl.so.2
	CUDA string // Dir/libcuda.so.1
}

// Build compiles the stand-ins into dir (which must exist) and returns their
// paths. It takes well under a second with gcc -O2.
func Build(dir string) (Libraries, error) {
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return Libraries{}, err
	}
	for _, name := range []string{"standin.h", "cuda.c", "nccl.c"} {
		b, err := sources.ReadFile("csrc/" + name)
		if err != nil {
			return Libraries{}, err
		}
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			return Libraries{}, err
		}
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	libs := Libraries{Dir: dir, NCCL: filepath.Join(dir, "libnccl.so.2"), CUDA: filepath.Join(dir, "libcuda.so.1")}
	steps := [][]string{
		{cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", libs.CUDA,
			filepath.Join(src, "cuda.c"), "-lpthread"},
		// libnccl links the CUDA stand-in by soname, found through its
		// run path, the way the real NCCL reaches the driver.
		{cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", libs.NCCL,
			filepath.Join(src, "nccl.c"), "-L" + dir, "-l:libcuda.so.1", "-Wl,-rpath," + dir, "-lpthread", "-lrt"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return Libraries{}, fmt.Errorf("nccltest: %v: %w\n%s", s, err, out)
		}
	}
	return libs, nil
}
