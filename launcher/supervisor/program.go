package supervisor

import "github.com/gorun-hpc/gorun/internal/elfneeded"

// programs is what a supervisor learns of its ranks' executables, each
// fact read from the ELF file at most once per path: a job's ranks mostly
// run one program, and the reads (build info, the closure of needed
// libraries) cost milliseconds each. The supervisor's goroutine alone
// uses it, so it needs no lock.
type programs map[string]*program

// program is one executable's facts; each is read the first time it is
// asked for (a fact nobody asks for is never read).
type program struct {
	path           string
	hwloc, runtime fact
}

// fact is a lazily read yes/no.
type fact int8

const (
	factUnread fact = iota
	factNo
	factYes
)

// get reads the fact once through read.
func (f *fact) get(read func() bool) bool {
	if *f == factUnread {
		*f = factNo
		if read() {
			*f = factYes
		}
	}
	return *f == factYes
}

// of returns the record for path, making it on first use.
func (ps programs) of(path string) *program {
	p := ps[path]
	if p == nil {
		p = &program{path: path}
		ps[path] = p
	}
	return p
}

// needsHwloc: the program's library closure includes libhwloc.so.15, the
// library the shared topology is made with (topology.go).
func (p *program) needsHwloc() bool {
	return p.hwloc.get(func() bool {
		soname, _ := elfneeded.Find(p.path, func(s string) bool { return s == hwlocSoname })
		return soname != ""
	})
}

// onRuntime: the program is built on gorun's Go runtime (bind.go).
func (p *program) onRuntime() bool {
	return p.runtime.get(func() bool { return gorunRuntime(p.path) })
}
