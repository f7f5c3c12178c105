package comm_test

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/gorun-hpc/gorun/comm"
)

// schedChildEnv names the job a scheduling-group child joins.
const schedChildEnv = "GORUN_COMM_SCHED_CHILD"

// schedChildMain joins the job's scheduling group as a crowded rank would,
// prints where it went and its tag, and leaves when stdin says so.
func schedChildMain() int {
	before, _ := os.ReadFile("/proc/self/autogroup")
	joined, leave, err := comm.JoinSchedGroup(os.Getenv(schedChildEnv), comm.OnlineCPUs()+1)
	fmt.Printf("joined=%s tag=%d autogroup=%s err=%v\n", joined, comm.SchedGroupTag(), strings.Fields(string(before) + " ?")[0], err)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	leave()
	fmt.Println("left")
	return 0
}
