package relay_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/relay"
)

// With QuarantineOrderKeep the later events of an aggregate whose event is
// quarantined are quarantined behind it (another aggregate flows
// meanwhile), a relay started again holds the aggregate still, and once the
// cause is fixed a requeue publishes them all in their order; nothing stays
// held.
func TestQuarantineOrderKeepHoldsLaterEventsUntilRequeued(t *testing.T) {
	t.Parallel()
	b := setupOrder(t)
	b.cfg.QuarantineOrder = relay.QuarantineOrderKeep
	stop := b.runUntilStopped(t, b.cfg)

	a1 := b.writeOne(t, "a", 1, false)
	a2 := b.writeOne(t, "a", 2, true)
	b1 := b.writeOne(t, "b", 1, false)
	held := []string{a2, b.writeOne(t, "a", 3, false), b.writeOne(t, "a", 4, false)}
	b2 := b.writeOne(t, "b", 2, false)
	held = append(held, b.writeOne(t, "a", 5, false))
	b3 := b.writeOne(t, "b", 3, false)

	rows := waitQuarantined(t, b.bundle, 4)
	c := consume(t, []string{b.topic}, []string{a1, b1, b2, b3}, time.Minute, 500*time.Millisecond)
	for _, id := range held {
		if c.byID[id] != 0 {
			t.Fatalf("%s reached Kafka while an earlier event of its aggregate was quarantined", b.names[id])
		}
	}
	checkHeld(t, b, rows, held)

	// A relay started again loads the held aggregate from outbox_quarantine.
	stop()
	b.runUntilStopped(t, b.cfg)
	a6 := b.writeOne(t, "a", 6, false)
	b4 := b.writeOne(t, "b", 4, false)
	held = append(held, a6)
	rows = waitQuarantined(t, b.bundle, 5)
	c = consume(t, []string{b.topic}, []string{b4}, time.Minute, 500*time.Millisecond)
	if c.byID[a6] != 0 {
		t.Fatal("after a restart, a later event of the held aggregate reached Kafka")
	}
	checkHeld(t, b, rows, held)

	b.raiseLimit(t)
	if n, err := relay.Requeue(b.ctx, b.db.Pool, nil); err != nil || n != int64(len(held)) {
		t.Fatalf("Requeue = %d, %v; want %d", n, err, len(held))
	}
	a7 := b.writeOne(t, "a", 7, false)
	c = consume(t, []string{b.topic}, append(held, a7), time.Minute, 0)
	if got, want := b.order(c, "a"), []string{"a1", "a2", "a3", "a4", "a5", "a6", "a7"}; !slices.Equal(got, want) {
		t.Fatalf("aggregate a reached Kafka as %v, want %v", got, want)
	}
	if rows := quarantine(t, b.bundle); len(rows) != 0 {
		t.Fatalf("%d events still quarantined after the requeue: %+v", len(rows), rows)
	}
}

// checkHeld asserts that the quarantine holds exactly want, in that order:
// the first refused by Kafka, the rest behind it, naming it.
func checkHeld(t *testing.T, b *orderBundle, rows []relay.QuarantinedEvent, want []string) {
	t.Helper()
	var got []string
	for _, r := range rows {
		got = append(got, b.names[r.ID.String()])
	}
	var names []string
	for _, id := range want {
		names = append(names, b.names[id])
	}
	if !slices.Equal(got, names) {
		t.Fatalf("quarantine holds %v, want %v in that order", got, names)
	}
	if rows[0].Reason != relay.ReasonMessageTooLarge {
		t.Fatalf("%s quarantined as %s, want %s", got[0], rows[0].Reason, relay.ReasonMessageTooLarge)
	}
	for _, r := range rows[1:] {
		if r.Reason != relay.ReasonBehindQuarantined || !strings.Contains(r.Error, want[0]) {
			t.Fatalf("%s quarantined as %s (%s), want %s naming %s", b.names[r.ID.String()], r.Reason, r.Error, relay.ReasonBehindQuarantined, want[0])
		}
	}
}

// With QuarantineOrderKeep a discarded event releases its aggregate: the
// events behind it, requeued, are published, and so are new ones, whether
// the events held are requeued or all discarded.
func TestQuarantineOrderKeepDiscardReleases(t *testing.T) {
	t.Parallel()
	b := setupOrder(t)
	b.cfg.QuarantineOrder = relay.QuarantineOrderKeep
	b.start(t, b.cfg)

	a1 := b.writeOne(t, "a", 1, false)
	a2 := b.writeOne(t, "a", 2, true)
	a3 := b.writeOne(t, "a", 3, false)
	waitQuarantined(t, b.bundle, 2)
	if n, err := relay.Discard(b.ctx, b.db.Pool, []uuid.UUID{uuid.MustParse(a2)}); err != nil || n != 1 {
		t.Fatalf("Discard(a2) = %d, %v; want 1", n, err)
	}
	if n, err := relay.Requeue(b.ctx, b.db.Pool, []uuid.UUID{uuid.MustParse(a3)}); err != nil || n != 1 {
		t.Fatalf("Requeue(a3) = %d, %v; want 1", n, err)
	}
	a4 := b.writeOne(t, "a", 4, false)
	c := consume(t, []string{b.topic}, []string{a1, a3, a4}, time.Minute, 0)
	if got, want := b.order(c, "a"), []string{"a1", "a3", "a4"}; !slices.Equal(got, want) {
		t.Fatalf("aggregate a reached Kafka as %v, want %v", got, want)
	}

	// Everything held discarded: new events flow within a second.
	a5 := b.writeOne(t, "a", 5, true)
	a6 := b.writeOne(t, "a", 6, false)
	waitQuarantined(t, b.bundle, 2)
	if n, err := relay.Discard(b.ctx, b.db.Pool, nil); err != nil || n != 2 {
		t.Fatalf("Discard(all) = %d, %v; want 2", n, err)
	}
	var left int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])`, []string{a2, a5, a6}).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d discarded events left in the outbox (%v), want 0", left, err)
	}
	time.Sleep(1100 * time.Millisecond) // the relay asks outbox_quarantine again after a second
	a7 := b.writeOne(t, "a", 7, false)
	c = consume(t, []string{b.topic}, []string{a7}, time.Minute, 0)
	if got, want := b.order(c, "a"), []string{"a1", "a3", "a4", "a7"}; !slices.Equal(got, want) {
		t.Fatalf("aggregate a reached Kafka as %v, want %v", got, want)
	}
	if rows := quarantine(t, b.bundle); len(rows) != 0 {
		t.Fatalf("%d events quarantined, want 0: %+v", len(rows), rows)
	}
}
