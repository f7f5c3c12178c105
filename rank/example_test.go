package rank_test

import (
	"context"
	"fmt"
	"log"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rank"
)

// A rank program: start, all-reduce over the world, close. Under gorun,
// torchrun or srun the launcher's variables give the identity; this example
// hides the environment (Lookup) so that it runs alone, as a world of one.
func ExampleInit() {
	ctx := context.Background()
	opts := rank.DefaultOptions()
	opts.Lookup = func(string) (string, bool) { return "", false } // as if started by hand
	r, err := rank.Init(ctx, opts)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	grad := []float32{1, 2, 3}
	c := r.Comm()
	if err := c.AllReduce(ctx, comm.Float32s(grad), comm.Float32s(grad), comm.Sum).Wait(ctx); err != nil {
		r.Abort(err) // the peers stop now, and Close does not wait for them
		log.Fatal(err)
	}
	fmt.Println(r.Source(), r.Rank(), r.Size(), grad)
	// Output: alone 0 1 [1 2 3]
}

// Subgroups for hybrid sharding: shard groups of consecutive ranks and
// replica groups across them, each with its own communicator on the rank's
// one endpoint. Close closes them before the world communicator.
func ExampleRank_NewComm() {
	ctx := context.Background()
	r, err := rank.Init(ctx, rank.DefaultOptions())
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	const shard = 2 // ranks per shard group; the world size is a multiple
	me := r.Rank()
	var shardRanks, replicaRanks []int
	for q := range r.Size() {
		if q/shard == me/shard {
			shardRanks = append(shardRanks, q)
		}
		if q%shard == me%shard {
			replicaRanks = append(replicaRanks, q)
		}
	}
	sg, err := r.Group(shardRanks)
	if err != nil {
		log.Fatal(err)
	}
	shardComm, err := r.NewComm(ctx, sg, "shard")
	if err != nil {
		log.Fatal(err)
	}
	rg, err := r.Group(replicaRanks)
	if err != nil {
		log.Fatal(err)
	}
	replicaComm, err := r.NewComm(ctx, rg, "replica")
	if err != nil {
		log.Fatal(err)
	}
	_, _ = shardComm, replicaComm
}
