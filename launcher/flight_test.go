package launcher

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun-hpc/gorun/launcher/supervisor"
	"github.com/gorun-hpc/gorun/launcher/wire"
)

// The supervisor removes the job's temporary flight directory when gorun's
// command pipe ends without "bye" (gorun died), even while gorun's process
// still looks like its parent: the kernel closes a dying process's
// descriptors before it reparents the children, so the parent check alone
// left the directory behind. After "bye" the directory is gorun's to read
// and remove. The test process stays alive and stays the supervisor's
// parent throughout, which is exactly the window the parent check missed.
func TestSupervisorRemovesFlightDirUnlessBye(t *testing.T) {
	tests := []struct {
		name        string
		bye         bool
		wantRemoved bool
	}{
		{"pipe ends without bye: gorun died", false, true},
		{"bye, then the pipe ends: gorun cleans up", true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "flight")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			// A dump a rank wrote: RemoveAll must take contents too.
			if err := os.WriteFile(filepath.Join(dir, "ready.1"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			sup, err := supervisor.Start("", nil, os.Stderr, "")
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				sup.ReadEvents(func(wire.Event) {})
			}()
			// A rank that runs until the supervisor kills it, so the
			// supervisor is still running when the pipe ends.
			spec := wire.SupervisorSpec{Grace: time.Second, LogLevel: zerolog.WarnLevel, RemoveDir: dir,
				Ranks: []wire.SupervisorRank{{Rank: 0, Path: "/bin/sleep", Argv: []string{"sleep", "60"}, Env: os.Environ(), Stdin: -1, Stdout: -1, Stderr: -1}}}
			if err := sup.Send(spec); err != nil {
				t.Fatal(err)
			}
			if tc.bye {
				if err := sup.Send(wire.Cmd{Op: "bye"}); err != nil {
					t.Fatal(err)
				}
			}
			sup.CloseCommands()
			_ = sup.Wait()
			<-done
			sup.CloseEvents()
			_, err = os.Stat(dir)
			if removed := os.IsNotExist(err); removed != tc.wantRemoved {
				t.Errorf("flight directory removed: %v, want %v (stat: %v)", removed, tc.wantRemoved, err)
			}
		})
	}
}
