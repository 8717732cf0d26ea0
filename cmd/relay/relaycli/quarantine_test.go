package relaycli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// --quarantine-order takes skip or keep, and a wrong value is refused by
// name; discard, like requeue, wants --id or --all.
func TestQuarantineSettingsAreValidated(t *testing.T) {
	t.Setenv("FERRY_DATABASE_URL", "")
	t.Setenv("FERRY_KAFKA_BROKERS", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--database-url", "postgres://x@127.0.0.1/x", "--kafka-brokers", "127.0.0.1:1", "--quarantine-order", "sideways"}, "QuarantineOrder"},
		{[]string{"quarantine", "discard", "--database-url", "postgres://x@127.0.0.1:1/x"}, "--all"},
		{[]string{"quarantine", "discard", "--database-url", "postgres://x@127.0.0.1:1/x", "--id", "nope"}, "--id"},
		{[]string{"quarantine", "forget"}, "quarantine discard"},
	} {
		code, _, stderr := run(t, context.Background(), c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("relay %v: exit %d, stderr %q; want exit 2 naming %s", c.args, code, stderr, c.want)
		}
	}
}

// relay quarantine discard deletes the events it names for good, from the
// quarantine and the outbox, and says so; the others stay.
func TestQuarantineDiscard(t *testing.T) {
	db := ferrytest.NewMigratedDB(t)
	t.Setenv("FERRY_DATABASE_URL", db.URL)
	ctx := context.Background()
	gone, kept := uuid.New(), uuid.New()
	for _, id := range []uuid.UUID{gone, kept} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'a', '1', 'E', '')`, id); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox_quarantine (id, aggregate_type, aggregate_id, event_type, payload, created_at, topic, reason, error)
			VALUES ($1, 'a', '1', 'E', '', now(), 't', 'invalid_record', 'test')`, id); err != nil {
			t.Fatal(err)
		}
	}
	// An id that is not quarantined is refused by name, and nothing goes.
	stranger := uuid.NewString()
	if code, _, stderr := run(t, ctx, "quarantine", "discard", "--id", gone.String()+", "+stranger); code != 1 || !strings.Contains(stderr, stranger) {
		t.Fatalf("relay quarantine discard of an id not quarantined: exit %d, want 1 and an error naming it\n%s", code, stderr)
	}
	code, out, stderr := run(t, ctx, "quarantine", "discard", "--id", gone.String())
	if code != 0 || !strings.Contains(out, "discarded 1 quarantined events for good") {
		t.Fatalf("relay quarantine discard: exit %d\n%s\n%s", code, out, stderr)
	}
	var quarantined, outbox []uuid.UUID
	for q, dst := range map[string]*[]uuid.UUID{`SELECT id FROM outbox_quarantine`: &quarantined, `SELECT id FROM outbox`: &outbox} {
		rows, err := db.Pool.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id uuid.UUID
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			*dst = append(*dst, id)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if len(quarantined) != 1 || quarantined[0] != kept || len(outbox) != 1 || outbox[0] != kept {
		t.Fatalf("after discarding %s: quarantine %v, outbox %v; want only %s in each", gone, quarantined, outbox, kept)
	}
}
