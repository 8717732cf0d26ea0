package workercli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// dlq parked list shows what inbox_parked holds, with the record's text
// escaped; redrive wants a selection.
func TestParkedCommands(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, message_id,
		record_key, record_value, header_keys, header_values, record_timestamp, reason, error, attempts, dead_letter_error)
		VALUES ('billing', 'orders', 3, 41, 'm-`+"\x1b]0;pwned\x07"+`', 'k', '\x00', '{}', '{}', now(), 'undecodable', 'bad', 1,
		'MESSAGE_TOO_LARGE')`); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(ctx, nil, "dlq", "parked", "list", "--database-url", db.URL)
	if code != 0 || !strings.Contains(stdout, "orders/3/41") || !strings.Contains(stdout, "MESSAGE_TOO_LARGE") ||
		!strings.Contains(stdout, "1 parked messages") || strings.ContainsAny(stdout, "\x1b\x07") {
		t.Fatalf("dlq parked list: exit %d\n%q\n%s", code, stdout, stderr)
	}
	code, _, stderr = run(ctx, nil, "dlq", "parked", "redrive", "--database-url", db.URL)
	if code != 2 || !strings.Contains(stderr, "--all") {
		t.Fatalf("dlq parked redrive without a selection: exit %d, want 2 naming --all\n%s", code, stderr)
	}
}

// A redrive that finds nothing for what it was asked names it and exits
// 1, as `relay quarantine requeue` does: a dead-letter id the topic does
// not hold, a consumer with no dead letter, a consumer with no parked
// message. Redriving every parked message of an empty table is no
// failure.
func TestRedriveThatFindsNothingExitsOne(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	brokers := strings.Join(ferrytest.Brokers(t), ",")
	dlq := ferrytest.Topic(t, 1) + ".dlq"
	ferrytest.CreateTopic(t, dlq, 1)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "redrive", "--topic", dlq, "--id", "00000000-0000-0000-0000-000000000009"}, `"00000000-0000-0000-0000-000000000009"`},
		{[]string{"dlq", "redrive", "--topic", dlq, "--consumer", "nosuch"}, "no dead letter matches"},
		{[]string{"dlq", "parked", "redrive", "--consumer", "nosuch", "--database-url", db.URL}, `consumer "nosuch"`},
	} {
		code, stdout, stderr := run(ctx, nil, append(c.args, "--kafka-brokers", brokers)...)
		if code != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("worker %v: exit %d\n%s%s\nwant exit 1 naming %s", c.args, code, stdout, stderr, c.want)
		}
	}
	code, stdout, stderr := run(ctx, nil, "dlq", "parked", "redrive", "--all", "--database-url", db.URL, "--kafka-brokers", brokers)
	if code != 0 || !strings.Contains(stdout, "0 redriven") {
		t.Errorf("dlq parked redrive --all of an empty inbox_parked: exit %d\n%s%s\nwant 0", code, stdout, stderr)
	}
}
