package model

import (
	"os"
	"os/exec"
	"regexp"
	"testing"
)

// TestNoFusedMultiplyAdd compiles this package for amd64 with FMA available
// (GOAMD64=v3, where the compiler fuses a*b+c unless the product is
// converted) and fails if any fused instruction is emitted. A fused and an
// unfused build would round differently, and ranks or runs built for
// different targets would no longer agree bit for bit.
func TestNoFusedMultiplyAdd(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the package; skipped in -short")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not in PATH")
	}
	cmd := exec.Command(goTool, "build", "-o", os.DevNull, "-gcflags=-S", ".")
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=amd64", "GOAMD64=v3", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	fused := regexp.MustCompile(`(?m)^.*\bVF(N)?M(ADD|SUB)\w*\b.*$`)
	for _, line := range fused.FindAllString(string(out), 10) {
		t.Errorf("fused multiply-add emitted: %s", line)
	}
}
