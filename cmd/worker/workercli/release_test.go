//go:build !ferryfault

package workercli_test

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"

	"github.com/ferryhq/ferry/internal/cli/clitest"
)

// A release worker has no flag that loses data on purpose: the negative
// controls exist only in ferryfault builds, the fault suite's.
func TestReleaseRunHasNoNegativeControl(t *testing.T) {
	t.Parallel()
	app := &workercli.App{Register: func(*inbox.Worker) error { return nil }}
	clitest.VerbHelpListsItsOwnFlags(t, "worker", func(args ...string) (int, string, string) { return run(context.Background(), app, args...) }, []clitest.Verb{
		{Args: []string{"run", "-h"}, Want: []string{"-consumers"},
			Never: []string{"-unsafe-commit-before-db", "-unsafe-no-migration-quarantine", "-unsafe-ack-before-db", "-unsafe-requeue-retries"}},
	})
}
