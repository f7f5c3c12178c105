package nccl

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// Config configures a Comm. Every member of a group must use an equal
// Library; the rest may differ per rank.
type Config struct {
	// Library names the libraries to load; DefaultLibraryConfig.
	Library LibraryConfig
	// Device is this rank's CUDA device ordinal among those it sees, or -1
	// to choose: device 0 when one is visible (the launcher's
	// CUDA_VISIBLE_DEVICES gives each rank one), otherwise LocalRank modulo
	// the device count, as torchrun's one-GPU-per-local-rank convention. -1.
	Device int
	// LocalRank is the rank on this host, for Device -1. 0; rank programs
	// set it from LOCAL_RANK.
	LocalRank int
	// ComputeStream is the stream whose work every call waits for (on the
	// device, without blocking the CPU) before it starts; WithStream
	// overrides it per call. 0, the legacy default stream, where
	// frameworks queue their kernels unless told otherwise.
	ComputeStream Stream
	// PollInterval is how often the watcher asks NCCL for an asynchronous
	// error (ncclCommGetAsyncError), which is how a broken connection or a
	// failed peer kernel shows up. 10 ms: errors surface in well under a
	// second, at a negligible CPU cost.
	PollInterval time.Duration
	// InitTimeout bounds ncclCommInitRankConfig, for a peer that hangs
	// without dying (a dead one fails the group at once). 5 minutes:
	// NCCL's init on large jobs takes tens of seconds.
	InitTimeout time.Duration
	// Logger receives lifecycle events; the zero value discards.
	Logger zerolog.Logger
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Library:      DefaultLibraryConfig(),
		Device:       -1,
		PollInterval: 10 * time.Millisecond,
		InitTimeout:  5 * time.Minute,
		Logger:       zerolog.Nop(),
	}
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	switch {
	case c.Library.NCCL == "" || c.Library.CUDA == "":
		return errors.New("nccl: config: Library.NCCL and Library.CUDA must name libraries")
	case c.Device < -1:
		return fmt.Errorf("nccl: config: Device %d (want -1 or an ordinal)", c.Device)
	case c.LocalRank < 0:
		return fmt.Errorf("nccl: config: LocalRank %d is negative", c.LocalRank)
	case c.PollInterval <= 0:
		return fmt.Errorf("nccl: config: PollInterval %v must be positive", c.PollInterval)
	case c.InitTimeout <= 0:
		return fmt.Errorf("nccl: config: InitTimeout %v must be positive", c.InitTimeout)
	}
	return nil
}
