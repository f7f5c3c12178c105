package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gorun-hpc/gorun/launcher"
)

// readHosts turns -H or -hostfile into a host list; nil means "this
// machine, one slot per rank".
//
// TODO(issue 2): switch to launcher.ParseHostList / launcher.ParseHostfile
// (SLURM hostlists, Open MPI hostfiles) once they land; until then -H takes
// plain host[:slots] entries and -hostfile is refused.
func readHosts(o options) ([]launcher.Host, error) {
	if o.hostfile != "" {
		return nil, fmt.Errorf("-hostfile %s: hostfile parsing is not available in this build", o.hostfile)
	}
	if o.hostList == "" {
		return nil, nil
	}
	var hosts []launcher.Host
	for _, e := range strings.Split(o.hostList, ",") {
		name, slots := e, 1
		if i := strings.LastIndexByte(e, ':'); i >= 0 && !strings.HasSuffix(e, "]") {
			n, err := strconv.Atoi(e[i+1:])
			if err != nil || n < 1 {
				return nil, fmt.Errorf("-H %q: slots in %q must be a positive number", o.hostList, e)
			}
			name, slots = e[:i], n
		}
		if name == "" {
			return nil, fmt.Errorf("-H %q: empty host name", o.hostList)
		}
		hosts = append(hosts, launcher.Host{Name: name, Slots: slots})
	}
	return hosts, nil
}
