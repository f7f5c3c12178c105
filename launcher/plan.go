package launcher

import "github.com/gorun-hpc/gorun/launcher/plan"

// The plan has its own package, which is pure (launcher/plan). The two
// names nearly every step of a job speaks of stay here as aliases, as Host
// does; the rest (plan.New, plan.Config, plan.Node, its errors) are called
// by their package's name.
type (
	// Plan is which rank runs where and with which environment (plan.Plan).
	Plan = plan.Plan
	// RankSpec is one rank of a Plan (plan.RankSpec).
	RankSpec = plan.RankSpec
)
