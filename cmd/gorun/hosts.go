package main

import (
	"fmt"

	"github.com/gorun-hpc/gorun/hostlist"
	"github.com/gorun-hpc/gorun/launcher"
)

// readHosts turns -H or -hostfile into a host list; nil means "this
// machine, one slot per rank". Inside a SLURM allocation (SLURM_JOB_ID
// set) without either, the allocation's nodes and task counts are the
// hosts and slots, and slurm reports that agents must start with srun.
func readHosts(o options, getenv func(string) string) (hosts []launcher.Host, slurm bool, err error) {
	switch {
	case o.hostfile != "":
		h, err := launcher.ParseHostfile(o.hostfile)
		return h, false, err
	case o.hostList != "":
		h, err := launcher.ParseHostList(o.hostList)
		return h, false, err
	case getenv("SLURM_JOB_ID") != "" && o.launcher != "ssh":
		h, err := slurmHosts(getenv)
		return h, err == nil, err
	}
	return nil, false, nil
}

// slurmHosts reads the allocation: SLURM_JOB_NODELIST (hostlist
// expression) and SLURM_TASKS_PER_NODE ("2(x3),1"), SLURM_NODELIST and
// SLURM_JOB_CPUS_PER_NODE as fallbacks.
func slurmHosts(getenv func(string) string) ([]launcher.Host, error) {
	nodes := getenv("SLURM_JOB_NODELIST")
	if nodes == "" {
		nodes = getenv("SLURM_NODELIST")
	}
	tasks := getenv("SLURM_TASKS_PER_NODE")
	if tasks == "" {
		tasks = getenv("SLURM_JOB_CPUS_PER_NODE")
	}
	if nodes == "" || tasks == "" {
		return nil, fmt.Errorf("inside SLURM job %s but SLURM_JOB_NODELIST or SLURM_TASKS_PER_NODE is not set (run gorun inside salloc/sbatch, or give -H/-hostfile)",
			getenv("SLURM_JOB_ID"))
	}
	nt, err := hostlist.ZipTasks(nodes, tasks)
	if err != nil {
		return nil, fmt.Errorf("SLURM allocation: %w", err)
	}
	hosts := make([]launcher.Host, 0, len(nt))
	for _, n := range nt {
		hosts = append(hosts, launcher.Host{Name: n.Name, Slots: n.Tasks})
	}
	return hosts, nil
}
