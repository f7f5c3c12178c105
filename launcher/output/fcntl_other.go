//go:build !linux

package output

import "errors"

func fcntlGetfl(fd int) (int, error) { return 0, errors.New("output: no poller here") }

func pipeBuffered(fd int) int { return 0 }
