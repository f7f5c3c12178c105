// Package consolelog owns the look of the human-readable logs that gorun,
// its supervisors and host agents, and the ranks write: their lines
// interleave on one terminal, so they carry one clock format, the wall time
// to the millisecond ("00:20:22.568"), which is what orders events that are
// milliseconds apart. It leaves levels and fields to the caller.
package consolelog

import (
	"io"
	"time"

	"github.com/rs/zerolog"
)

// TimeFormat is the time layout of every console log line.
const TimeFormat = "15:04:05.000"

// Writer returns a console writer in the shared format, without colors.
func Writer(w io.Writer) zerolog.ConsoleWriter {
	return zerolog.ConsoleWriter{Out: w, NoColor: true, TimeFormat: TimeFormat}
}

// New returns a logger at level that writes console lines to w, each
// stamped with the wall clock to the nanosecond (shown to the millisecond).
// It does not depend on zerolog.TimeFieldFormat, a process-wide setting
// whose default keeps only whole seconds.
func New(w io.Writer, level zerolog.Level) zerolog.Logger {
	return zerolog.New(Writer(w)).Level(level).Hook(stamp{})
}

// stamp adds the time field when an event is written.
type stamp struct{}

func (stamp) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(zerolog.TimestampFieldName, time.Now().Format(time.RFC3339Nano))
}
