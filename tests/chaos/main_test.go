package chaos

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gorun-hpc/gorun/launcher/launchertest"
	"github.com/gorun-hpc/gorun/tests/testhosts"
)

// gorunBin is the gorun binary built for the run; selfBin this test binary,
// which is every row's rank program. hosts are the namespace hosts of the
// "hosts" rows (root only; hostsErr says why there are none).
var (
	gorunBin, selfBin string
	hosts             *testhosts.Netns
	hostsErr          error
)

// numHosts: one rank per host, as many ranks as the local rows.
const numHosts = 3

func TestMain(m *testing.M) {
	maybeInit()
	maybeRank()
	maybeSpawner()
	maybeFlooder()
	launchertest.FastRaceExit()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gorun-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	gorunBin = filepath.Join(dir, "gorun")
	if err := launchertest.GoBuild(dir, "cmd/gorun"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if selfBin, err = os.Executable(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	flag.Parse()
	if !testing.Short() && os.Geteuid() == 0 {
		hosts, hostsErr = testhosts.StartNetns(context.Background(), numHosts)
		if hosts != nil {
			defer hosts.Close()
		}
	} else {
		hostsErr = fmt.Errorf("namespace hosts need root and no -short")
	}
	return m.Run()
}
