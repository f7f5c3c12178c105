package rendezvous

import (
	"bytes"
	"log"

	"github.com/rs/zerolog"
)

// memberlistLogger turns memberlist's "[LEVEL] memberlist: ..." lines into
// zerolog events on the World's logger (with its rank, host and world
// fields). memberlist's levels are shifted down one step: its DEBUG is a
// per-packet trace, its WARN and ERR include the normal noise of members
// going away at the end of a job (refused connections, failed probes), which
// this package reports itself, as one clear line, when it matters.
type memberlistLogger struct{ log zerolog.Logger }

func newMemberlistLogger(l zerolog.Logger) *log.Logger {
	return log.New(memberlistLogger{l}, "", 0)
}

func (m memberlistLogger) Write(p []byte) (int, error) {
	line := bytes.TrimRight(p, "\n")
	lvl := zerolog.DebugLevel
	for _, x := range []struct {
		tag string
		lvl zerolog.Level
	}{
		{"[DEBUG]", zerolog.TraceLevel},
		{"[INFO]", zerolog.DebugLevel},
		{"[WARN]", zerolog.DebugLevel},
		{"[ERR]", zerolog.InfoLevel},
	} {
		if i := bytes.Index(line, []byte(x.tag)); i >= 0 {
			lvl, line = x.lvl, bytes.TrimSpace(line[i+len(x.tag):])
			break
		}
	}
	m.log.WithLevel(lvl).Msg(string(line))
	return len(p), nil
}
