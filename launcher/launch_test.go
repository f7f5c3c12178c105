package launcher

import (
	"reflect"
	"strings"
	"testing"
)

func TestSlurmHosts(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want []Host
		err  string
	}{
		{name: "allocation", env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3],vm", "SLURM_TASKS_PER_NODE": "2(x2),1,4"},
			want: []Host{{Name: "n1", Slots: 2}, {Name: "n2", Slots: 2}, {Name: "n3", Slots: 1}, {Name: "vm", Slots: 4}}},
		{name: "older variable names", env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_NODELIST": "a0[08-09]", "SLURM_JOB_CPUS_PER_NODE": "8(x2)"},
			want: []Host{{Name: "a008", Slots: 8}, {Name: "a009", Slots: 8}}},
		{name: "counts do not match nodes", env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"},
			err: "SLURM allocation"},
		{name: "bad hostlist", env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-", "SLURM_TASKS_PER_NODE": "2"},
			err: "SLURM allocation"},
		{name: "variables missing", env: map[string]string{"SLURM_JOB_ID": "7"}, err: "SLURM_JOB_NODELIST or SLURM_TASKS_PER_NODE is not set"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SlurmHosts(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("SlurmHosts = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
