package bench

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if maybeRankHelper() {
		return
	}
	goleak.VerifyTestMain(m)
}
