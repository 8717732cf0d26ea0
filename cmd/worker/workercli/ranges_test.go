package workercli_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
)

// An explicit 0 is refused, not replaced by the default the engine gives an
// unset field; an absurd value is refused before anything is allocated for
// it (a lane per key, a connection per transaction); a dead-letter suffix
// that would make the dead-letter topic the topic itself is refused; each
// error names the flag (or the variable) that set it, and exits 2.
func TestRangesAreRefusedByFlagName(t *testing.T) {
	t.Setenv("FERRY_DATABASE_URL", "")
	t.Setenv("FERRY_KAFKA_BROKERS", "")
	app := &workercli.App{Register: func(w *inbox.Worker) error {
		w.Handle("ranges", "ranges-topic", func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
		return nil
	}}
	db := []string{"--database-url", "postgres://x@127.0.0.1:1/x"}
	cmd := func(command []string, args ...string) []string {
		return slices.Concat(command, db, args)
	}
	run_ := cmd([]string{"run", "--kafka-brokers", "127.0.0.1:1", "--http-addr", "off"})
	with := func(args ...string) []string { return slices.Concat(run_, args) }
	cases := []struct {
		args []string
		want string
	}{
		{with("--concurrency", "0"), "concurrency"},
		{with("--concurrency", "-1"), "concurrency"},
		{with("--concurrency", "2147483647"), "--concurrency"},
		{with("--key-concurrency", "50000000"), "--key-concurrency"},
		{with("--key-concurrency", "0"), "key-concurrency"},
		{with("--batch-size", "0"), "batch-size"},
		{with("--max-attempts", "0"), "max-attempts"},
		{with("--handler-timeout", "0"), "handler-timeout"},
		{with("--retry-backoff", "0"), "retry-backoff"},
		{with("--drain-timeout", "0"), "drain-timeout"},
		{with("--commit-interval", "0"), "commit-interval"},
		{with("--inbox-retention-min", "0"), "inbox-retention-min"},
		{with("--dlq-suffix", ""), "--dlq-suffix"},
		{with("--kafka-compression", "brotli"), "--kafka-compression"},
		{with("--dlq-suffix", ".dlq\x1b"), "--dlq-suffix"},
		{cmd([]string{"prune"}, "--prune-batch-size", "0"), "prune-batch-size"},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a worker that started instead stops here
		code, _, stderr := run(ctx, app, c.args...)
		cancel()
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("worker %q: exit %d, stderr %q; want exit 2 naming %s", c.args, code, stderr, c.want)
		}
	}
	t.Setenv("FERRY_CONCURRENCY", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if code, _, stderr := run(ctx, app, run_...); code != 2 || !strings.Contains(stderr, "FERRY_CONCURRENCY") {
		t.Errorf("worker run with FERRY_CONCURRENCY=0: exit %d, stderr %q; want exit 2 naming the variable", code, stderr)
	}
}
