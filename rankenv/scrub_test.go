package rankenv

import (
	"slices"
	"testing"
)

// Another launcher's PMI, PMIx and Open MPI world variables go; user
// settings of those libraries and everything else stay, in order.
func TestWithoutOtherLaunchers(t *testing.T) {
	env := []string{
		"PATH=/bin", "PMI_RANK=3", "PMI_SIZE=4", "PMI_FD=9", "PMI_PORT=h:1", "PMI_ID=5",
		"PMI_SPAWNED=0", "PMI_JOBID=j", "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4",
		"PMIX_RANK=3", "PMIX_SERVER_URI41=x", "PMIX_MCA_gds=hash", "OMPI_MCA_btl=self",
		"PMI_DEBUG=1", "HOME=/root", "NOEQUALS",
	}
	orig := slices.Clone(env)
	want := []string{"PATH=/bin", "PMIX_MCA_gds=hash", "OMPI_MCA_btl=self", "PMI_DEBUG=1", "HOME=/root", "NOEQUALS"}
	if got := WithoutOtherLaunchers(env); !slices.Equal(got, want) {
		t.Fatalf("WithoutOtherLaunchers = %q\nwant %q", got, want)
	}
	if !slices.Equal(env, orig) {
		t.Fatalf("the input was modified: %q", env)
	}
}
