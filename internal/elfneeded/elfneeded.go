// Package elfneeded walks an ELF program's needed libraries, the way the
// dynamic loader would find them, looking for one: the launcher asks it
// whether a program links Open MPI (which gorun refuses) and the
// supervisor whether it links libhwloc (which the shared topology needs).
// It reads files and opens nothing else; a file that is not ELF has no
// needed libraries.
package elfneeded

import (
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
)

// maxOpened bounds how many libraries a walk opens: programs link tens of
// libraries, and a check must stay a few milliseconds.
const maxOpened = 64

// Find walks the ELF program's needed libraries breadth first and
// returns the first soname for which match is true, with the libraries
// that led to it ("", nil when none does or path is not ELF).
func Find(path string, match func(soname string) bool) (string, []string) {
	type item struct {
		path  string
		chain []string
	}
	ldPath := filepath.SplitList(os.Getenv("LD_LIBRARY_PATH"))
	queue := []item{{path: path}}
	seen := map[string]bool{}
	for opened := 0; len(queue) > 0 && opened < maxOpened; opened++ {
		it := queue[0]
		queue = queue[1:]
		f, err := elf.Open(it.path)
		if err != nil {
			continue
		}
		needed, _ := f.ImportedLibraries()
		var search []string
		for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
			vals, _ := f.DynString(tag)
			for _, v := range vals {
				for _, d := range filepath.SplitList(v) {
					search = append(search, strings.ReplaceAll(d, "$ORIGIN", filepath.Dir(it.path)))
				}
			}
		}
		f.Close()
		search = append(search, ldPath...)
		search = append(search, "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
			"/lib", "/usr/lib", "/usr/local/lib", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
		for _, n := range needed {
			if match(n) {
				return n, it.chain
			}
			if seen[n] || strings.HasPrefix(n, "libc.so") || strings.HasPrefix(n, "ld-linux") {
				continue
			}
			seen[n] = true
			for _, d := range search {
				p := filepath.Join(d, n)
				if _, err := os.Stat(p); err == nil {
					queue = append(queue, item{path: p, chain: append(append([]string(nil), it.chain...), n)})
					break
				}
			}
		}
	}
	return "", nil
}
