// Command hello is the smallest Go rank program: it joins the job's world,
// sums one number over every rank and prints the result.
//
//	gorun -np 4 bin/hello
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/gorun-hpc/gorun/comm"
	"github.com/gorun-hpc/gorun/rank"
)

func main() {
	ctx := context.Background()
	// Identity from gorun's variables (torchrun's or SLURM's work too; run
	// by hand, it is a world of one), then the rendezvous and the world
	// communicator.
	r, err := rank.Init(ctx, rank.DefaultOptions())
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()

	x := []float32{float32(r.Rank() + 1)}
	if err := r.Comm().AllReduce(ctx, comm.Float32s(x), comm.Float32s(x), comm.Sum).Wait(ctx); err != nil {
		r.Abort(err) // tell the peers now instead of leaving them waiting
		log.Fatal(err)
	}
	fmt.Printf("rank %d of %d: sum of 1..%d = %g\n", r.Rank(), r.Size(), r.Size(), x[0])
}
