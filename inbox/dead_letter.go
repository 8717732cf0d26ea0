package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// Headers a dead letter carries next to the original record's headers.
const (
	HeaderDeadLetterReason            = "ferry.dlq.reason"             // ReasonXxx
	HeaderDeadLetterError             = "ferry.dlq.error"              // the last error's text
	HeaderDeadLetterAttempts          = "ferry.dlq.attempts"           // handler calls made
	HeaderDeadLetterOriginalTopic     = "ferry.dlq.original_topic"     // where the record came from
	HeaderDeadLetterOriginalPartition = "ferry.dlq.original_partition" //
	HeaderDeadLetterOriginalOffset    = "ferry.dlq.original_offset"    //
	HeaderDeadLetterOriginalTimestamp = "ferry.dlq.original_timestamp" // RFC 3339, UTC
	HeaderDeadLetterConsumer          = "ferry.dlq.consumer"           // the consumer that gave up
	HeaderDeadLetterFailedAt          = "ferry.dlq.failed_at"          // RFC 3339, UTC

	// HeaderRedrivenFrom is set on a redriven record: the dead letter's
	// topic/partition/offset.
	HeaderRedrivenFrom = "ferry.redrive.from"
)

const deadLetterHeaderPrefix = "ferry.dlq."

// deadLetterRecord builds the dead letter of rec: its key, value and headers
// (without the dead-letter headers of an earlier failure) plus the
// failure's context.
func deadLetterRecord(rec *kgo.Record, topic, consumer, reason string, cause error, attempts int, failedAt time.Time) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, len(rec.Headers)+9)
	for _, h := range rec.Headers {
		if !strings.HasPrefix(h.Key, deadLetterHeaderPrefix) {
			headers = append(headers, h)
		}
	}
	errText := ""
	if cause != nil {
		errText = errorText(cause)
	}
	add := func(k, v string) { headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(HeaderDeadLetterReason, reason)
	add(HeaderDeadLetterError, errText)
	add(HeaderDeadLetterAttempts, strconv.Itoa(attempts))
	add(HeaderDeadLetterOriginalTopic, rec.Topic)
	add(HeaderDeadLetterOriginalPartition, strconv.Itoa(int(rec.Partition)))
	add(HeaderDeadLetterOriginalOffset, strconv.FormatInt(rec.Offset, 10))
	add(HeaderDeadLetterOriginalTimestamp, rec.Timestamp.UTC().Format(time.RFC3339Nano))
	add(HeaderDeadLetterConsumer, consumer)
	add(HeaderDeadLetterFailedAt, failedAt.UTC().Format(time.RFC3339Nano))
	return &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: headers}
}

// deadLetterDelivery dead-letters d and finishes it. A live migration's
// authoritative copy also gets its ferry_inbox_copy row, as an applied one
// does: the event is accounted for, and its shadow copy must not send it
// to the migration quarantine (InboxQuarantineShadows) as if it were lost.
func (p *partition) deadLetterDelivery(d *delivery, reason DeadLetterReason, cause error) bool {
	if !p.deadLetter(d.rec, d.m.ID, reason, cause, d.m.Attempt) {
		return false
	}
	d.event(spanEventDeadLetter, attribute.String(attrReason, string(reason)), attribute.String(attrDeadLetterTopic, p.w.cfg.DeadLetterTopic(d.rec.Topic)))
	if d.copyRow != nil && !p.retryDB("record the dead-lettered copy of a live migration", func(ctx context.Context, tx pgx.Tx) error {
		return p.w.queries.InboxCopyInsert(ctx, tx, *d.copyRow)
	}) {
		return false
	}
	p.finish(d.rec)
	d.endSpan(outcomeDeadLetteredStr, cause)
	return true
}

// deadLetter writes rec to its dead-letter topic and waits for Kafka's
// acknowledgement. A failed write is retried with backoff until it succeeds
// or the partition stops, and the partition is stuck meanwhile (Ready and
// ferry_worker_stuck_partitions say so). A dead letter Kafka refuses for
// good (larger than the producer or the dead-letter topic accepts) is
// parked in inbox_parked instead. Either way the message is finished only
// once a durable copy exists, so never committed without one.
func (p *partition) deadLetter(rec *kgo.Record, id string, reason DeadLetterReason, cause error, attempts int) bool {
	cfg := &p.w.cfg
	topic := cfg.DeadLetterTopic(rec.Topic)
	failedAt := time.Now()
	stuck := false
	defer func() {
		if stuck {
			p.unstick()
		}
	}()
	for n := 1; ; n++ {
		out := deadLetterRecord(rec, topic, p.g.name, string(reason), cause, attempts, failedAt)
		ctx, cancel := context.WithTimeout(p.stopCtx, 30*time.Second)
		err := p.g.produceDeadLetter(ctx, out, rec)
		cancel()
		if err == nil {
			p.metrics.deadLettered(string(reason))
			p.log.Warn("message dead-lettered", slog.String("id", id), slog.Int64("offset", rec.Offset),
				slog.String("reason", string(reason)), slog.Int("attempts", attempts), slog.String("dead_letter_topic", topic),
				slog.String("error", causeText(cause)))
			return true
		}
		if p.stopCtx.Err() != nil {
			return false
		}
		p.metrics.deadLetterError()
		if refusedForGood(err) {
			return p.park(rec, id, string(reason), cause, attempts, fmt.Errorf("dead-letter topic %s: %w", topic, err))
		}
		if !stuck {
			stuck = true
			p.stick(fmt.Sprintf("the dead letter of offset %d cannot be written to %s: %v", rec.Offset, topic, err))
		}
		wait := backoff.Delay(n, cfg.RetryBackoff, cfg.RetryBackoffMax)
		p.log.Error("cannot write dead letter; retrying (the message stays uncommitted until it is written)",
			slog.String("id", id), slog.Int64("offset", rec.Offset), slog.String("dead_letter_topic", topic),
			slog.Duration("retry_in", wait), slog.String("error", err.Error()))
		if !p.sleep(wait) {
			return false
		}
	}
}

// refusedForGood reports whether Kafka will refuse a dead letter however
// often it is sent: it is too large (the dead letter adds headers to a
// record that may already be near the limit) or malformed.
func refusedForGood(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage) ||
		errors.Is(err, rabbitmq.ErrMessageTooLarge) || errors.Is(err, rabbitmq.ErrInvalidRecord)
}

// park stores rec, which can be neither applied nor dead-lettered, in
// inbox_parked with both reasons, retrying the database with backoff (the
// partition is stuck meanwhile).
func (p *partition) park(rec *kgo.Record, id, reason string, cause error, attempts int, refused error) bool {
	cfg := &p.w.cfg
	stuck := false
	defer func() {
		if stuck {
			p.unstick()
		}
	}()
	keys := make([]string, len(rec.Headers))
	values := make([][]byte, len(rec.Headers))
	for i, h := range rec.Headers {
		keys[i], values[i] = h.Key, h.Value
	}
	params := dbsqlc.InboxParkedInsertParams{
		Consumer: p.g.name, Topic: rec.Topic, KafkaPartition: rec.Partition, KafkaOffset: rec.Offset, MessageID: id,
		RecordKey: rec.Key, RecordValue: rec.Value, HeaderKeys: keys, HeaderValues: values,
		RecordTimestamp: rec.Timestamp, Reason: reason, Error: causeText(cause), Attempts: int32(attempts),
		DeadLetterError: refused.Error(),
	}
	for n := 1; ; n++ {
		err := pgx.BeginFunc(p.stopCtx, cfg.DB, func(tx pgx.Tx) error {
			return p.w.queries.InboxParkedInsert(p.stopCtx, tx, params)
		})
		if err == nil {
			p.metrics.parked(reason)
			p.log.Error("message parked in inbox_parked: Kafka refuses its dead letter for good; `worker dlq parked` lists it",
				slog.String("id", id), slog.Int64("offset", rec.Offset), slog.String("reason", reason),
				slog.String("error", causeText(cause)), slog.String("dead_letter_error", refused.Error()))
			return true
		}
		if p.stopCtx.Err() != nil {
			return false
		}
		if !stuck {
			stuck = true
			p.stick(fmt.Sprintf("offset %d can be neither dead-lettered (%v) nor parked: %v", rec.Offset, refused, err))
		}
		p.metrics.databaseError()
		wait := backoff.Delay(n, cfg.RetryBackoff, cfg.RetryBackoffMax)
		p.log.Error("cannot park message; retrying (the message stays uncommitted until it is parked)",
			slog.String("id", id), slog.Int64("offset", rec.Offset), slog.Duration("retry_in", wait), slog.String("error", err.Error()))
		if !p.sleep(wait) {
			return false
		}
	}
}

func causeText(cause error) string {
	if cause == nil {
		return ""
	}
	return errorText(cause)
}
