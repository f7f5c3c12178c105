//go:build !gorun_nonetfault

package comm

import "fmt"

// wrapNetFaults wraps links[r] for every peer when a fault is armed in
// this process; otherwise it returns links unchanged. A malformed
// GORUN_NETFAULT is an error: a fault test that silently injects nothing
// would pass for the wrong reason.
func wrapNetFaults(links []Link, g Group) ([]Link, error) {
	plan, ok, err := loadNetPlan()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if !ok {
		return links, nil
	}
	me := g.GlobalRank(g.Rank())
	for r, l := range links {
		if l != nil {
			links[r] = newFaultLink(l, plan, me, g.GlobalRank(r), g.Host(g.Rank()), g.Host(r))
		}
	}
	return links, nil
}
