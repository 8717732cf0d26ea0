package workercli_test

import (
	"context"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// No output of any worker command shows a secret: not its help (whose
// defaults come from the environment), not a usage error, not the logs or
// error of a run that cannot reach its database or broker.
func TestNoCommandShowsASecret(t *testing.T) {
	app := &workercli.App{Name: "w", Register: func(w *inbox.Worker) error {
		w.Handle("c", "t", func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
		return nil
	}}
	main := func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return workercli.Main(ctx, args, stdout, stderr, app)
	}
	ferrytest.NoSecretShown(t, "worker", main, [][]string{
		{"run"}, {"status", "--consumers", "c"}, {"prune"}, {"migrate"}, {"migrate", "down"},
		{"dlq", "list", "--topic", "t.dlq"}, {"dlq", "redrive", "--topic", "t.dlq", "--all"},
		{"dlq", "parked", "list"}, {"dlq", "parked", "redrive", "--all"},
	})
}
