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
