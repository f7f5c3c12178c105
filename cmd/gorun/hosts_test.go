package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/gorun-hpc/gorun/launcher"
)

// readHosts picks the source of hosts; parsing the allocation itself is
// launcher.SlurmHosts' (tested there).
func TestReadHostsFromSlurm(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		o     options
		want  []launcher.Host
		slurm bool
		err   string
	}{
		{name: "no allocation", env: map[string]string{}},
		{name: "allocation", env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3],vm", "SLURM_TASKS_PER_NODE": "2(x2),1,4"},
			want: []launcher.Host{{Name: "n1", Slots: 2}, {Name: "n2", Slots: 2}, {Name: "n3", Slots: 1}, {Name: "vm", Slots: 4}}, slurm: true},
		{name: "-H wins over the allocation", env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "2"},
			o: options{hostList: "localhost:3"}, want: []launcher.Host{{Name: "localhost", Slots: 3}}},
		{name: "--launcher ssh ignores the allocation", env: map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "2"},
			o: options{launcher: "ssh"}},
		{name: "variables missing", env: map[string]string{"SLURM_JOB_ID": "7"}, err: "SLURM_JOB_NODELIST or SLURM_TASKS_PER_NODE is not set"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, slurm, err := readHosts(tc.o, func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.err)
				}
				return
			}
			if err != nil || slurm != tc.slurm || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("readHosts = %v, %v, %v; want %v, %v", got, slurm, err, tc.want, tc.slurm)
			}
		})
	}
}

func TestSplitWords(t *testing.T) {
	tests := []struct {
		in   string
		want []string
		bad  bool
	}{
		{in: "ssh", want: []string{"ssh"}},
		{in: "  ssh -p 2222  ", want: []string{"ssh", "-p", "2222"}},
		{in: `ssh -o "ProxyJump bastion" -i '/k ey'`, want: []string{"ssh", "-o", "ProxyJump bastion", "-i", "/k ey"}},
		{in: `ip netns exec {host}`, want: []string{"ip", "netns", "exec", "{host}"}},
		{in: `a ""`, want: []string{"a", ""}},
		{in: `ssh "x`, bad: true},
	}
	for _, tc := range tests {
		got, err := splitWords(tc.in)
		if tc.bad != (err != nil) || !tc.bad && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("splitWords(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
