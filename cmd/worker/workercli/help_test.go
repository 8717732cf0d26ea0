package workercli_test

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry/internal/cli/clitest"
)

// Asking a command group for help (`worker migration quarantine -h`) is
// not a wrong command line: it prints the group's usage on stdout, no
// error, and exits 0, as `worker help` does.
func TestCommandGroupHelpExitsZero(t *testing.T) {
	t.Parallel()
	clitest.GroupHelpExitsZero(t, "worker", worker, []clitest.Group{
		{Args: []string{"migration", "-h"}, Want: "migration quarantine replay"},
		{Args: []string{"migration", "quarantine", "-h"}, Want: "migration quarantine replay"},
		{Args: []string{"migration", "quarantine", "--help"}, Want: "migration quarantine replay"},
		{Args: []string{"migration", "quarantine", "help"}, Want: "migration quarantine replay"},
		{Args: []string{"dlq", "-h"}, Want: "dlq redrive --topic T"},
		{Args: []string{"dlq", "parked", "-h"}, Want: "dlq parked redrive"},
	})
}

// Each verb's -h lists the flags it takes, not those of another verb.
func TestVerbHelpListsItsOwnFlags(t *testing.T) {
	t.Parallel()
	clitest.VerbHelpListsItsOwnFlags(t, "worker", worker, []clitest.Verb{
		{Args: []string{"migration", "quarantine", "list", "-h"}, Want: []string{"-consumer", "-database-url"}, Never: []string{"-all", "-id", "-kafka-brokers"}},
		{Args: []string{"migration", "quarantine", "replay", "-h"}, Want: []string{"-consumer", "-all", "-id", "-kafka-brokers"}},
		{Args: []string{"dlq", "list", "-h"}, Want: []string{"-topic", "-id"}, Never: []string{"-all"}},
		{Args: []string{"dlq", "redrive", "-h"}, Want: []string{"-topic", "-id", "-all"}},
		{Args: []string{"dlq", "parked", "list", "-h"}, Want: []string{"-consumer", "-limit"}, Never: []string{"-all", "-kafka-brokers"}},
		{Args: []string{"dlq", "parked", "redrive", "-h"}, Want: []string{"-consumer", "-all", "-kafka-brokers"}},
		// schema, and migrate, its first name kept as an alias.
		{Args: []string{"schema", "-h"}, Want: []string{"-inbox-partitioning", "-yes"}, Never: []string{"-consumer"}},
		{Args: []string{"migrate", "-h"}, Want: []string{"-inbox-partitioning", "-yes"}, Never: []string{"-consumer"}},
	})
}

// worker runs the worker's command line in this process.
func worker(args ...string) (int, string, string) { return run(context.Background(), nil, args...) }
