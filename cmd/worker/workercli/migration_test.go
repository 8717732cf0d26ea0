package workercli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// migration quarantine list shows the events of a live migration never
// applied, escaped; replay wants a selection, publishes the event back to
// the topic and partition of its shadow copy, with its id and without the
// route stamp, and empties the quarantine.
func TestMigrationQuarantineCommands(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	topic := ferrytest.Topic(t, 2)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ferry_inbox_quarantine (consumer, message_id, plan, side, topic, partition,
		record_offset, record_key, record_value, record_headers, reason, received_at)
		VALUES ('billing', 'm-`+"\x1b]0;pwned\x07"+`', 'move', 'old', $1, 1, 41, 'k', 'v',
		'[{"k":"id","v":"bS0x"},{"k":"ferry.route","v":"eA=="}]', 'the authoritative copy was never applied', now())`, topic); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(ctx, nil, "migration", "quarantine", "list", "--database-url", db.URL)
	if code != 0 || !strings.Contains(stdout, "old "+topic+"/1/41") || !strings.Contains(stdout, "1 quarantined events") ||
		strings.ContainsAny(stdout, "\x1b\x07") {
		t.Fatalf("migration quarantine list: exit %d\n%q\n%s", code, stdout, stderr)
	}
	code, _, stderr = run(ctx, nil, "migration", "quarantine", "replay", "--database-url", db.URL)
	if code != 2 || !strings.Contains(stderr, "--all") {
		t.Fatalf("migration quarantine replay without a selection: exit %d, want 2 naming --all\n%s", code, stderr)
	}
	code, stdout, stderr = run(ctx, nil, "migration", "quarantine", "replay", "--consumer", "billing",
		"--database-url", db.URL, "--kafka-brokers", strings.Join(ferrytest.Brokers(t), ","))
	if code != 0 || !strings.Contains(stdout, "1 replayed") {
		t.Fatalf("migration quarantine replay: exit %d\n%s\n%s", code, stdout, stderr)
	}
	cl := ferrytest.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got *kgo.Record
	for got == nil && pctx.Err() == nil {
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { got = r })
	}
	if got == nil || got.Partition != 1 || string(got.Key) != "k" || string(got.Value) != "v" {
		t.Fatalf("replayed record %+v, want k=v on partition 1", got)
	}
	var id string
	for _, h := range got.Headers {
		if h.Key == "ferry.route" {
			t.Fatalf("the replayed record keeps its route stamp: %v", got.Headers)
		}
		if h.Key == "id" {
			id = string(h.Value)
		}
	}
	if id != "m-1" {
		t.Fatalf("replayed record's id %q, want m-1 (its original)", id)
	}
	if n := count(t, db, `SELECT count(*) FROM ferry_inbox_quarantine`); n != 0 {
		t.Fatalf("%d events still quarantined after the replay", n)
	}
}

func count(t *testing.T, db *ferrytest.DB, q string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
