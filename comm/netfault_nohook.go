//go:build gorun_nonetfault

package comm

// wrapNetFaults, built with -tags gorun_nonetfault, never wraps: the
// binary has no fault hook at all, the baseline that
// scripts/bench-netfault.sh measures the hook against.
func wrapNetFaults(links []Link, _ Group) ([]Link, error) { return links, nil }
