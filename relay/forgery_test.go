package relay_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/relay"
)

// A row written with SQL against a table without the reserved-header
// constraint (an older schema) may carry event_type or ferry.dlq.* in its
// own headers. Published, a consumer could read it instead of the relay's
// event_type, and a dead-letter redrive could trust it. The relay
// quarantines it with its reason and publishes the rows after it; an
// aggregate type that would name a dead-letter topic is quarantined too.
func TestRelayNeverPublishesReservedHeadersOrIntoDeadLetterTopics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_headers_not_reserved`); err != nil {
		t.Fatal(err)
	}
	insert := func(aggType, headers string) string {
		t.Helper()
		id := uuid.New()
		if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
			VALUES ($1, $2, 'o-1', 'AuditNoteOnly', '\x7b7d'::bytea, $3::jsonb)`, id, aggType, headers); err != nil {
			t.Fatal(err)
		}
		return id.String()
	}
	forgedType := insert("order", `{"event_type": "OrderPlaced"}`)
	forgedDLQ := insert("order", `{"ferry.dlq.original_topic": "payments", "ferry.dlq.reason": "permanent"}`)
	intoDLQ := insert("order.dlq", `{}`)
	honest := b.write(t, evt("order", "o-1", 1))

	b.start(t, b.cfg)
	c := consume(t, []string{topic}, honest, time.Minute, 500*time.Millisecond)
	for _, id := range []string{forgedType, forgedDLQ, intoDLQ} {
		if c.byID[id] != 0 {
			t.Fatalf("event %s reached Kafka", id)
		}
	}
	want := map[string]relay.QuarantineReason{forgedType: relay.ReasonReservedHeader, forgedDLQ: relay.ReasonReservedHeader, intoDLQ: relay.ReasonInvalidTopic}
	rows := waitQuarantined(t, b, len(want))
	for _, q := range rows {
		if q.Reason != want[q.ID.String()] {
			t.Errorf("event %s quarantined for %s (%s), want %s", q.ID, q.Reason, q.Error, want[q.ID.String()])
		}
	}
}
