package plan

import (
	"errors"
	"fmt"

	"github.com/gorun-hpc/gorun/internal/plural"
)

// MaxRanks is the most ranks one job may have. A plan holds one environment
// of about a kilobyte per rank, so this bounds a plan at a few hundred MB;
// it is well above the largest jobs gorun is meant for (thousands of hosts
// of eight GPUs).
const MaxRanks = 1 << 18

// ErrNoRanks is returned when a plan would start no rank.
var ErrNoRanks = errors.New("launcher: no ranks to start")

// SlotsError reports that the hosts cannot take the requested number of
// ranks.
type SlotsError struct {
	// Requested is the number of ranks asked for (-np).
	Requested int
	// Slots is the total number of slots over all hosts.
	Slots int
	// Hosts is the number of hosts.
	Hosts int
	// MaxSlots is the total cap when oversubscribing (0 when the request
	// was refused because oversubscription was not allowed).
	MaxSlots int
}

func (e *SlotsError) Error() string {
	if e.MaxSlots > 0 {
		return fmt.Sprintf("launcher: %d ranks requested but max_slots allows only %d on %d %s",
			e.Requested, e.MaxSlots, e.Hosts, plural.Noun(e.Hosts, "host", "hosts"))
	}
	return fmt.Sprintf("launcher: %d ranks requested but only %d %s available on %d %s (use --oversubscribe to place more ranks than slots)",
		e.Requested, e.Slots, plural.Noun(e.Slots, "slot", "slots"), e.Hosts, plural.Noun(e.Hosts, "host", "hosts"))
}

// CapacityError reports a rank count that a limit of gorun or of a machine
// cannot serve; nothing was started. New checks gorun's (MaxRanks); the
// launcher checks the machine's (descriptors, processes) with the same
// type, before planning.
type CapacityError struct {
	// Ranks is the number of ranks asked for.
	Ranks int
	// Resource names the limit: "ranks", "open files" or "processes".
	Resource string
	// Need is how much of it the job would take, Limit how much there is.
	Need, Limit int
	// Where says which limit it is and how to raise it.
	Where string
	// FromSlots is set when the count is the hosts' slots (no -np); it
	// was counted only until it passed the limit.
	FromSlots bool
}

func (e *CapacityError) Error() string {
	if e.Resource == "ranks" && e.FromSlots {
		return fmt.Sprintf("launcher: the hosts' slots make more than %d ranks, gorun's limit for one job; give -np", e.Limit)
	}
	if e.Resource == "ranks" {
		return fmt.Sprintf("launcher: %d ranks requested; gorun runs at most %d ranks in one job", e.Ranks, e.Limit)
	}
	return fmt.Sprintf("launcher: %d ranks on this machine need about %d %s, but the limit is %d (%s); run fewer ranks or raise the limit",
		e.Ranks, e.Need, e.Resource, e.Limit, e.Where)
}
