package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/outbox"
)

// QuarantinedEvent is an outbox event that Kafka refused for good, as the
// relay stored it in outbox_quarantine. Requeue moves it back into the
// outbox once its cause is fixed.
type QuarantinedEvent struct {
	// ID is the outbox id, the one consumers deduplicate on; a requeued
	// event keeps it.
	ID            uuid.UUID
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       []byte
	// Headers are the application's headers of the event, without the ones
	// the relay adds.
	Headers map[string]string
	// CreatedAt is when the application wrote the event.
	CreatedAt time.Time
	// Topic is where the relay tried to publish it.
	Topic string
	// Reason is why: ReasonMessageTooLarge, ReasonInvalidTopic,
	// ReasonInvalidRecord, ReasonUnknownTopic, ReasonUnroutable (RabbitMQ),
	// or ReasonBehindQuarantined
	// (Config.QuarantineOrder keep; Error names the event it is held behind).
	Reason QuarantineReason
	// Error is the text of Kafka's (or the relay's) refusal.
	Error string
	// CommitLSN is the WAL position of the transaction that wrote the event,
	// empty when unknown.
	CommitLSN string
	// QuarantinedAt is when the relay stored it here.
	QuarantinedAt time.Time
}

// ListQuarantined lists the events in outbox_quarantine, oldest first, at
// most limit of them. db is a pool, a connection or a transaction.
func ListQuarantined(ctx context.Context, db outbox.DBTX, limit int) ([]QuarantinedEvent, error) {
	rows, err := dbsqlc.New().OutboxQuarantineList(ctx, db, int32(limit))
	if err != nil {
		return nil, fmt.Errorf("list quarantined events: %w", err)
	}
	events := make([]QuarantinedEvent, len(rows))
	for i, r := range rows {
		e := &events[i]
		*e = QuarantinedEvent{
			ID: r.ID, AggregateType: r.AggregateType, AggregateID: r.AggregateID, EventType: r.EventType,
			Payload: r.Payload, CreatedAt: r.CreatedAt, Topic: r.Topic, Reason: QuarantineReason(r.Reason), Error: r.Error,
			QuarantinedAt: r.QuarantinedAt,
		}
		if r.CommitLsn != nil {
			e.CommitLSN = *r.CommitLsn
		}
		if err := json.Unmarshal(r.Headers, &e.Headers); err != nil {
			return nil, fmt.Errorf("list quarantined events: headers of %s: %w", r.ID, err)
		}
	}
	return events, nil
}
