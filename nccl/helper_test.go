package nccl

import (
	"fmt"
	"os"
)

// helperMain is the test binary run as a helper process (GORUN_NCCL_HELPER
// names the role); it returns the exit code.
func helperMain(role string) int {
	switch role {
	case "rank":
		return rankMain()
	case "open":
		// Load the libraries named in the environment and print the
		// result in one line, as a rank program would report it.
		cfg := DefaultLibraryConfig()
		if p := os.Getenv("HELPER_CUDA"); p != "" {
			cfg.CUDA = p
		}
		l, err := Open(cfg)
		if err != nil {
			fmt.Println(err)
			return 3
		}
		fmt.Printf("ok NCCL %v, %d device(s)\n", l.Version, l.Devices)
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper %q\n", role)
	return 2
}
