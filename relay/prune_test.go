package relay_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ferryhq/ferry/relay"
)

// Outbox retention deletes an expired row only once the slot confirmed it:
// while no relay has published them, expired rows stay; once the relay
// runs (with Config.Prune), they go, and rows inside the window stay.
func TestPruneDeletesOnlyConfirmedExpiredRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 5 {
		ids = append(ids, b.write(t, evt("order", "old", i))...)
	}
	// The UPDATE is not published (the publication carries inserts only).
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE outbox SET created_at = now() - interval '10 days'`); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, b.write(t, evt("order", "new", 1), evt("order", "new", 2), evt("order", "new", 3))...)
	count := func() int {
		var n int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// No relay has run: the slot confirmed none of them.
	res, err := relay.Prune(b.ctx, b.db.Pool, b.slot, &relay.PruneConfig{ConfirmWait: 300 * time.Millisecond})
	if !errors.Is(err, relay.ErrUnconfirmed) || res == nil || res.Deleted != 0 {
		t.Fatalf("Prune before the relay ran: %+v, %v; want nothing deleted and ErrUnconfirmed", res, err)
	}
	if n := count(); n != 8 {
		t.Fatalf("%d outbox rows after an unconfirmed prune, want all 8", n)
	}
	if _, err := relay.Prune(b.ctx, b.db.Pool, "no_such_slot", nil); !errors.Is(err, relay.ErrSlotMissing) {
		t.Fatalf("Prune with a missing slot: %v, want ErrSlotMissing", err)
	}

	cfg := b.cfg
	cfg.Prune = &relay.PruneConfig{Interval: 100 * time.Millisecond}
	b.start(t, cfg)
	consume(t, []string{topic}, ids, time.Minute, 0)
	deadline := time.Now().Add(time.Minute)
	for count() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d outbox rows a minute after the relay published them, want the 3 inside the window", count())
		}
		time.Sleep(50 * time.Millisecond)
	}
	var recent int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox WHERE aggregate_id = 'new'`).Scan(&recent); err != nil || recent != 3 {
		t.Fatalf("%d recent rows left (%v), want 3", recent, err)
	}
}
