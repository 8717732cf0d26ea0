package relaycli_test

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry/internal/cli/clitest"
)

// Asking a command group for help (`relay quarantine -h`) is not a wrong
// command line: it prints the group's usage on stdout and exits 0, as
// `relay help` does.
func TestCommandGroupHelpExitsZero(t *testing.T) {
	t.Parallel()
	clitest.GroupHelpExitsZero(t, "relay", relay(t), []clitest.Group{
		{Args: []string{"quarantine", "-h"}, Want: "relay quarantine requeue"},
		{Args: []string{"quarantine", "--help"}, Want: "relay quarantine discard"},
		{Args: []string{"migration", "-h"}, Want: "relay migration request NAME PHASE"},
		{Args: []string{"migration", "help"}, Want: "relay migration history NAME"},
	})
}

// Each verb's -h lists the flags it takes, not those of another verb.
func TestVerbHelpListsItsOwnFlags(t *testing.T) {
	t.Parallel()
	clitest.VerbHelpListsItsOwnFlags(t, "relay", relay(t), []clitest.Verb{
		{Args: []string{"quarantine", "list", "-h"}, Want: []string{"-limit", "-database-url"}, Never: []string{"-all", "-id"}},
		{Args: []string{"quarantine", "requeue", "-h"}, Want: []string{"-all", "-id"}, Never: []string{"-limit"}},
		{Args: []string{"quarantine", "discard", "-h"}, Want: []string{"-all", "-id"}, Never: []string{"-limit"}},
		// schema, and migrate, its first name kept as an alias.
		{Args: []string{"schema", "-h"}, Want: []string{"-no-slot", "-outbox-partitioning", "-yes"}, Never: []string{"-slices"}},
		{Args: []string{"migrate", "-h"}, Want: []string{"-no-slot", "-outbox-partitioning", "-yes"}, Never: []string{"-slices"}},
	})
}

// relay runs the relay's command line in this process.
func relay(t *testing.T) clitest.Run {
	return func(args ...string) (int, string, string) { return run(t, context.Background(), args...) }
}
