package relaycli_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// An explicit 0 is refused, not replaced by the default the engine gives an
// unset field; an absurd value is refused before anything is allocated for
// it; each error names the flag (or the variable) that set it, and exits 2.
func TestRangesAreRefusedByFlagName(t *testing.T) {
	t.Setenv("FERRY_DATABASE_URL", "")
	t.Setenv("FERRY_KAFKA_BROKERS", "")
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
		{with("--max-in-flight", "0"), "max-in-flight"},
		{with("--kafka-compression", "brotli"), "--kafka-compression"},
		{with("--cloudevents-source", "/has space"), "--cloudevents-source"},
		{with("--cloudevents-content-type", "application/json"), "--cloudevents-content-type"},
		{with("--cloudevents-source", "/orders", "--cloudevents-content-type", "not a type"), "--cloudevents-content-type"},
		{with("--max-in-flight", "-5"), "max-in-flight"},
		{with("--max-in-flight", "2000000000"), "--max-in-flight"},
		{with("--status-interval", "0"), "status-interval"},
		{with("--status-interval", "30s"), "--status-interval"},
		{with("--server-timeout", "0"), "server-timeout"},
		{with("--kafka-linger", "-1ms"), "--kafka-linger"},
		{with("--kafka-linger", "2s"), "--kafka-linger"},
		{with("--read-window", "1s"), "--read-window"},
		{with("--read-window", "-5ms"), "--read-window"},
		{with("--unknown-topic-wait", "0"), "unknown-topic-wait"},
		{with("--health-timeout", "0"), "health-timeout"},
		{with("--shutdown-timeout", "0"), "shutdown-timeout"},
		{with("--outbox-retention", "0"), "outbox-retention"},
		{with("--prune-batch-size", "0"), "prune-batch-size"},
		{cmd([]string{"prune"}, "--prune-confirm-wait", "0"), "prune-confirm-wait"},
		{cmd([]string{"prune"}, "--outbox-retention", "200000000d"), "outbox-retention"},
		{cmd([]string{"recover", "--kafka-brokers", "127.0.0.1:1"}, "--recover-margin", "0"), "recover-margin"},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a relay that started instead stops here
		code, _, stderr := run(t, ctx, c.args...)
		cancel()
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("relay %v: exit %d, stderr %q; want exit 2 naming %s", c.args, code, stderr, c.want)
		}
	}
	t.Setenv("FERRY_MAX_IN_FLIGHT", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if code, _, stderr := run(t, ctx, run_...); code != 2 || !strings.Contains(stderr, "FERRY_MAX_IN_FLIGHT") {
		t.Errorf("relay run with FERRY_MAX_IN_FLIGHT=0: exit %d, stderr %q; want exit 2 naming the variable", code, stderr)
	}
}
