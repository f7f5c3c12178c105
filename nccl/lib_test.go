package nccl

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runOpen runs Open in a fresh helper process (a library, once loaded,
// stays loaded) with env added, and returns its one line of output and
// exit code.
func runOpen(t *testing.T, env ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{"GORUN_NCCL_HELPER=open"}, env...)...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out)), code
}

func TestOpenReportsWhatIsMissing(t *testing.T) {
	empty := t.TempDir()
	cases := []struct {
		name string
		env  []string
		code int
		want []string // substrings of the one line
	}{
		{"no driver", []string{"LD_LIBRARY_PATH=" + empty, "HELPER_CUDA=libcuda.so.1"}, 3,
			[]string{"cannot load libcuda.so.1", "NVIDIA driver", "No such file"}},
		{"no device", []string{"LD_LIBRARY_PATH=" + standins.Dir, "STANDIN_CUDA_DEVICES=0", "CUDA_VISIBLE_DEVICES=7"}, 3,
			[]string{"no CUDA device", "CUDA_ERROR_NO_DEVICE", `CUDA_VISIBLE_DEVICES "7"`}},
		{"no nccl", []string{"LD_LIBRARY_PATH=" + standins.Dir, "GORUN_NCCL_LIBRARY=" + filepath.Join(empty, "libnccl.so.2")}, 3,
			[]string{"cannot load " + filepath.Join(empty, "libnccl.so.2"), "(NCCL)"}},
		{"old nccl", []string{"LD_LIBRARY_PATH=" + standins.Dir, "STANDIN_NCCL_VERSION=21306"}, 3,
			[]string{"is NCCL 2.13.6; gorun needs 2.14.0 or newer"}},
		{"pre-2.9 version code", []string{"LD_LIBRARY_PATH=" + standins.Dir, "STANDIN_NCCL_VERSION=2803"}, 3,
			[]string{"is NCCL 2.8.3"}},
		{"all there", []string{"LD_LIBRARY_PATH=" + standins.Dir, "STANDIN_CUDA_DEVICES=2"}, 0,
			[]string{"ok NCCL 2.22.3, 2 device(s)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			line, code := runOpen(t, tc.env...)
			if code != tc.code || strings.Contains(line, "\n") {
				t.Fatalf("exit %d, output %q; want exit %d and one line", code, line, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("%q does not say %q", line, w)
				}
			}
		})
	}
}

func TestVersionOf(t *testing.T) {
	for code, want := range map[int]string{22203: "2.22.3", 21400: "2.14.0", 2803: "2.8.3", 2408: "2.4.8", 30001: "3.0.1"} {
		if got := versionOf(code).String(); got != want {
			t.Errorf("versionOf(%d) = %s, want %s", code, got, want)
		}
	}
	if !(Version{2, 13, 9}).Less(MinVersion) || (Version{2, 14, 0}).Less(MinVersion) || (Version{3, 0, 0}).Less(MinVersion) {
		t.Error("Less is wrong around MinVersion")
	}
}
