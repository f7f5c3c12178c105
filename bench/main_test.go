package bench

import (
	"context"
	"errors"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// corruptRankEnv makes the test binary act as one rank of `gorun bench
// allreduce` whose checked output has one element flipped on rank 1: the
// end-to-end proof that wrong results fail the job through the real
// launcher. A test binary as the rank keeps the hook out of gorun's flags.
const corruptRankEnv = "GORUN_BENCH_TEST_CORRUPT_RANK"

func TestMain(m *testing.M) {
	if os.Getenv(corruptRankEnv) != "" {
		os.Exit(corruptRank())
	}
	goleak.VerifyTestMain(removeBuilt{m})
}

// removeBuilt runs the tests, then removes the gorun binary the
// end-to-end tests built, whatever they did.
type removeBuilt struct{ m *testing.M }

func (r removeBuilt) Run() int {
	defer func() {
		if e2eDir != "" {
			_ = os.RemoveAll(e2eDir)
		}
	}()
	return r.m.Run()
}

func corruptRank() int {
	cfg := DefaultConfig()
	cfg.MinBytes, cfg.MaxBytes, cfg.Iters, cfg.Warmup = 1024, 1024, 2, 0
	cfg.Out = os.Stdout
	_, err := runRank(context.Background(), cfg, func(rank int, inPlace bool, out []byte) {
		if rank == 1 && !inPlace {
			out[0] ^= 0x40
		}
	})
	if errors.As(err, new(*WrongError)) {
		return 1
	}
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 3
	}
	return 0
}
