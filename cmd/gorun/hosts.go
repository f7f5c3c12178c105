package main

import (
	"github.com/gorun-hpc/gorun/launcher"
	"github.com/gorun-hpc/gorun/launcher/hostfile"
)

// readHosts turns -H or -hostfile into a host list; nil means "this
// machine, one slot per rank". Inside a SLURM allocation (SLURM_JOB_ID
// set) without either, the allocation's nodes and task counts are the
// hosts and slots (launcher.SlurmHosts), and slurm reports that host
// agents must start with srun.
func readHosts(o options, getenv func(string) string) (hosts []launcher.Host, slurm bool, err error) {
	switch {
	case o.hostfile != "":
		h, err := hostfile.Parse(o.hostfile)
		return h, false, err
	case o.hostList != "":
		h, err := hostfile.ParseList(o.hostList)
		return h, false, err
	case getenv("SLURM_JOB_ID") != "" && o.launcher != "ssh":
		h, err := launcher.SlurmHosts(getenv)
		return h, err == nil, err
	}
	return nil, false, nil
}
