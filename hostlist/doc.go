// Package hostlist owns the SLURM compact notations for node names and task
// counts: hostlist expressions such as "vm,n[01-03,7]" (SLURM_JOB_NODELIST,
// -H values, hostfile names) and task-count lists such as "2(x3),1"
// (SLURM_TASKS_PER_NODE), and pairing the two (ZipTasks).
//
// Expansion keeps the order written and never sorts or removes duplicates:
// rank placement follows host order, so "n[3,1]" must stay n3 before n1.
// Whether a name is a valid host name, and what a host's slots are, belong
// to the launcher; this package only turns the compact notation into a list.
package hostlist
