package ferrytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Stack runs scripts/stack with args (kafka-stop, kafka-start, pg-restart,
// ...) to inject a fault into the shared test stack. Tests that call it stop
// services every other test uses, so they carry the "faults" build tag and
// run alone, after the parallel suite (see scripts/test).
func Stack(t testing.TB, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(RepoRoot(t), "scripts", "stack"), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/stack %v: %v\n%s", args, err, out)
	}
}

// RepoRoot is the directory holding go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the working directory")
		}
		dir = parent
	}
}
