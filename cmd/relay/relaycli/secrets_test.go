package relaycli_test

import (
	"testing"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// No output of any relay command shows a secret: not its help (whose
// defaults come from the environment), not a usage error, not the logs or
// error of a run that cannot reach its database.
func TestNoCommandShowsASecret(t *testing.T) {
	ferrytest.NoSecretShown(t, "relay", relaycli.Main, [][]string{
		{"run"}, {"status"}, {"prune"}, {"recover"}, {"migrate"}, {"migrate", "down"}, {"migrate", "status"},
		{"quarantine", "list"}, {"quarantine", "requeue", "--all"}, {"quarantine", "discard", "--all"},
	})
}
