package readme_test

import (
	"os/exec"
	"regexp"
	"testing"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// internals are names the public packages must not export: the negative
// controls (ferryfault builds only) and the migration wire protocol
// (internal/route).
// go doc -all starts a declaration at the line's start and a member of a
// const or var block after a tab; doc text is indented by spaces.
var internals = regexp.MustCompile(`(?m)^((func|type|var|const) |\t)(Unsafe\w*|Stamp|ParseStamp|Fence|ParseFence|HeaderRoute|HeaderFence|LoadPlan|PayloadID|Copy|History|Step|Role|LateBounds)\b`)

// The public packages' documentation (go doc -all) shows no test switch
// and no wire-protocol type.
func TestPublicAPIHasNoInternals(t *testing.T) {
	t.Parallel()
	root := ferrytest.RepoRoot(t)
	for _, pkg := range []string{"./outbox", "./relay", "./inbox", "./migration", "./migration/bridge", "./schema"} {
		cmd := exec.Command("go", "doc", "-all", pkg)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go doc -all %s: %v\n%s", pkg, err, out)
		}
		for _, m := range internals.FindAllString(string(out), -1) {
			t.Errorf("go doc -all %s shows %q, which users must not touch", pkg, m)
		}
	}
}
