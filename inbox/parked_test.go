package inbox

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A message the handler cannot decode whose dead letter Kafka refuses for
// good (the original is just under the producer's 1,000,012-byte limit; the
// dead letter's headers push it over) neither blocks its partition nor is
// lost: it is parked in inbox_parked with both reasons, counted, and the
// next record is applied. Redriven once the handler is fixed, it is
// applied once and leaves inbox_parked.
func TestUndeliverableDeadLetterIsParked(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	big := b.record("m-big", "k", 0, 1)
	big.Value = bytes.Repeat([]byte("x"), 999_500)
	b.produce(big, b.record("m-next", "k", 0, 2))
	var fixed atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-big" {
			if !fixed.Load() {
				return Undecodable(errors.New("not a number"))
			}
			return insertEffect(ctx, tx, &Message{Consumer: m.Consumer, ID: m.ID, Key: m.Key, Payload: []byte("1"), Attempt: m.Attempt}, "")
		}
		return effectHandler(ctx, tx, m)
	}
	w := b.newWorker(b.config(), h)
	b.start(w)
	b.waitCommitted(b.consumer, 0, 2)
	if n := b.effects("m-next"); n != 1 {
		t.Fatalf("m-next has %d effects, want 1", n)
	}
	if st := w.Stats(); st.Parked != 1 || st.DeadLettered != 0 {
		t.Fatalf("stats %+v, want 1 parked and 0 dead-lettered", st)
	}
	parked, err := ListParked(b.ctx, b.db.Pool, b.consumer, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 {
		t.Fatalf("%d parked messages, want 1", len(parked))
	}
	p := parked[0]
	if p.ID != "m-big" || p.Reason != ReasonUndecodable || !strings.Contains(p.DeadLetterError, "MESSAGE_TOO_LARGE") ||
		!bytes.Equal(p.Value, big.Value) || p.Topic != b.topic || p.Offset != 0 || len(p.Headers) != len(big.Headers) {
		t.Fatalf("parked %+v (value %d bytes), want m-big, undecodable, MESSAGE_TOO_LARGE, its value and headers", p, len(p.Value))
	}
	if err := w.Ready(); err != nil {
		t.Fatalf("Ready after parking: %v", err)
	}

	fixed.Store(true)
	if err := RedriveParked(b.ctx, b.db.Pool, b.kopts, p); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the redriven message's effect", func() (bool, error) { return b.effects("m-big") == 1, nil })
	if left, err := ListParked(b.ctx, b.db.Pool, "", 10); err != nil || len(left) != 0 {
		t.Fatalf("after redrive, inbox_parked holds %d rows (%v), want none", len(left), err)
	}
}
