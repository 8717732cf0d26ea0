package relay

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/migration"
)

// QuarantineReason says why an event is in quarantine
// (QuarantinedEvent.Reason, stored in outbox_quarantine.reason).
type QuarantineReason string

// Quarantine reasons.
const (
	ReasonMessageTooLarge QuarantineReason = "message_too_large"
	ReasonInvalidTopic    QuarantineReason = "invalid_topic"
	ReasonInvalidRecord   QuarantineReason = "invalid_record"
	// ReasonReservedHeader is a row (written with SQL: the Go writer
	// refuses it) whose own headers use a name Ferry reserves.
	ReasonReservedHeader QuarantineReason = "reserved_header"
	// ReasonBehindQuarantined is an event held behind an earlier
	// quarantined event of its aggregate (Config.QuarantineOrder keep); its
	// error names that event.
	ReasonBehindQuarantined QuarantineReason = "behind_quarantined"
)

// permanentReason says whether Kafka will refuse a record however often it
// is sent, and why. Everything else (brokers down, leader changes,
// authorisation an operator can fix) is retried.
func permanentReason(err error) (QuarantineReason, bool) {
	switch {
	case errors.Is(err, errBatchTooLarge):
		return "", false // maybe innocent: resent after the client is rebuilt
	case errors.Is(err, rabbitmq.ErrMessageTooLarge):
		return ReasonMessageTooLarge, true
	case errors.Is(err, rabbitmq.ErrInvalidRecord):
		return ReasonInvalidRecord, true
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return ReasonMessageTooLarge, true
	case errors.Is(err, kerr.InvalidTopicException):
		return ReasonInvalidTopic, true
	case errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.CorruptMessage), errors.Is(err, kerr.InvalidTimestamp):
		return ReasonInvalidRecord, true
	}
	return "", false
}

// quarantined is a record on its way to outbox_quarantine.
type quarantined struct {
	p      *inflight
	reason QuarantineReason
	err    error
}

// quarantiner writes refused records to outbox_quarantine, retrying until
// the row is committed: only then does the record count as done, so a
// quarantined event is never confirmed before it is safely stored.
type quarantiner struct {
	db      *pgxpool.Pool
	queries *dbsqlc.Queries
	tracker *lsnTracker
	metrics *metrics
	logger  *slog.Logger
	broker  string // "Kafka" or "RabbitMQ", for the log
	in      chan quarantined
}

func (q *quarantiner) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case item := <-q.in:
			if out := item.p.out; out != nil && out.side == migration.NewSide && !out.settle(item.p) {
				continue // given up with its channel (releaseNew), acknowledged then
			}
			if !q.store(ctx, item) {
				return
			}
			q.tracker.ackOne(item.p.tx, item.p.size, item.p.copy)
		}
	}
}

func (q *quarantiner) store(ctx context.Context, item quarantined) bool {
	r := &item.p.row
	params := quarantineParams(item.p, item.reason, item.err)
	retry := backoff.Sequence{Base: 100 * time.Millisecond, Ceiling: 5 * time.Second}
	for {
		_, err := q.queries.OutboxQuarantineInsert(ctx, q.db, params)
		if err == nil {
			break
		}
		q.logger.Warn("cannot write to outbox_quarantine; retrying", slog.String("id", r.ID.String()), slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
			return false
		case <-time.After(retry.Next()):
		}
	}
	q.metrics.quarantined.WithLabelValues(string(item.reason)).Inc()
	q.metrics.nQuarantined.Add(1)
	msg := "event quarantined: " + q.broker + " refuses it for good"
	if item.reason == ReasonBehindQuarantined {
		msg = "event quarantined behind an earlier quarantined event of its aggregate"
	}
	q.logger.Warn(msg,
		slog.String("id", r.ID.String()), slog.String("topic", item.p.rec.Topic),
		slog.String("reason", string(item.reason)), slog.String("error", item.err.Error()))
	return true
}

// quarantine sends a record Kafka will never take to outbox_quarantine; in
// order-keeping mode through the session's aggregateHold, which quarantines
// the records of its aggregate waiting behind it after it.
func (s *session) quarantine(q quarantined) {
	q.p.endSpan(q.err)
	if s.hold != nil && !q.p.shadow {
		s.hold.refused(q)
		return
	}
	s.quar.in <- q
}

// quarantineParams is the outbox_quarantine row of a refused record. The
// commit LSN is unknown (nil) for a record a recovery republished.
func quarantineParams(p *inflight, reason QuarantineReason, err error) dbsqlc.OutboxQuarantineInsertParams {
	r := &p.row
	params := dbsqlc.OutboxQuarantineInsertParams{
		ID:            r.ID,
		AggregateType: string(r.AggregateType),
		AggregateID:   string(r.AggregateID),
		EventType:     string(r.EventType),
		Payload:       r.Payload,
		Headers:       headersJSON(r.Headers),
		CreatedAt:     r.CreatedAt,
		Topic:         p.rec.Topic,
		Reason:        string(reason),
		Error:         err.Error(),
	}
	if p.lsn != 0 {
		lsn := p.lsn.String()
		params.CommitLsn = &lsn
	}
	return params
}
