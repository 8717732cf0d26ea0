package inbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// Prune deletes only the inbox rows older than the window, a batch at a
// time, reports what it did, and leaves the outbox (the relay's to prune)
// alone.
func TestPruneDeletesOnlyExpiredRowsInBatches(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	q := dbsqlc.New()
	old := time.Now().Add(-10 * 24 * time.Hour)
	recent := time.Now().Add(-6 * 24 * time.Hour)
	for i := range 35 {
		if _, err := q.InboxInsert(ctx, db.Pool, dbsqlc.InboxInsertParams{Consumer: "c", MessageID: fmt.Sprintf("old-%d", i), Now: &old}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if _, err := q.InboxInsert(ctx, db.Pool, dbsqlc.InboxInsertParams{Consumer: "c", MessageID: fmt.Sprintf("recent-%d", i), Now: &recent}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT gen_random_uuid(), 'a', 'old', 'E', ''::bytea, $1 FROM generate_series(1, 25)
		UNION ALL SELECT gen_random_uuid(), 'a', 'new', 'E', ''::bytea, now() FROM generate_series(1, 3)`, old); err != nil {
		t.Fatal(err)
	}

	res, err := Prune(ctx, db.Pool, &PruneConfig{BatchSize: 10}) // 7-day windows
	if err != nil {
		t.Fatal(err)
	}
	// 10+10+10+5.
	if res.Deleted != 35 || res.Batches != 4 {
		t.Errorf("result %+v, want 35 inbox rows in 4 batches", res)
	}
	var inboxLeft, outboxLeft int
	if err := db.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM inbox WHERE message_id LIKE 'recent-%'),
		(SELECT count(*) FROM outbox)`).Scan(&inboxLeft, &outboxLeft); err != nil {
		t.Fatal(err)
	}
	var total int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM inbox) + (SELECT count(*) FROM outbox)`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if inboxLeft != 5 || outboxLeft != 28 || total != 33 {
		t.Errorf("left %d recent inbox rows, %d outbox rows, %d in all; want 5, 28 (all), 33", inboxLeft, outboxLeft, total)
	}
}

// A dedupe window below the safety minimum is refused before anything is
// deleted, with an error that explains the duplicate risk.
func TestPruneRefusesATooShortWindow(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	long := time.Now().Add(-48 * time.Hour)
	if _, err := dbsqlc.New().InboxInsert(ctx, db.Pool, dbsqlc.InboxInsertParams{Consumer: "c", MessageID: "m", Now: &long}); err != nil {
		t.Fatal(err)
	}
	_, err := Prune(ctx, db.Pool, &PruneConfig{InboxRetention: time.Hour})
	if !errors.Is(err, ErrRetentionTooShort) || !strings.Contains(err.Error(), "take effect twice") {
		t.Fatalf("Prune with a 1h window: %v, want ErrRetentionTooShort explaining the duplicates", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d inbox rows (%v), want 1: nothing may be deleted", n, err)
	}
	// Lowering the minimum deliberately allows it.
	res, err := Prune(ctx, db.Pool, &PruneConfig{InboxRetention: time.Hour, InboxRetentionMin: time.Hour})
	if err != nil || res.Deleted != 1 {
		t.Fatalf("Prune with the minimum lowered: %+v, %v", res, err)
	}
}
