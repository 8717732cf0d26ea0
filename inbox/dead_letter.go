package inbox

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/backoff"
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

func (p *partition) deadLetterDelivery(d *delivery, reason string, cause error) bool {
	if !p.deadLetter(d.rec, d.m.ID, reason, cause, d.m.Attempt) {
		return false
	}
	p.finish(d.rec)
	return true
}

// deadLetter writes rec to its dead-letter topic and waits for Kafka's
// acknowledgement. A failed write is retried with backoff until it succeeds
// or the partition stops: the message is never finished, so never
// committed, without its dead letter.
func (p *partition) deadLetter(rec *kgo.Record, id, reason string, cause error, attempts int) bool {
	cfg := &p.w.cfg
	topic := cfg.DeadLetterTopic(rec.Topic)
	failedAt := time.Now()
	for n := 1; ; n++ {
		out := deadLetterRecord(rec, topic, p.g.name, reason, cause, attempts, failedAt)
		ctx, cancel := context.WithTimeout(p.stopCtx, 30*time.Second)
		err := p.g.cl.ProduceSync(ctx, out).FirstErr()
		cancel()
		if err == nil {
			p.metrics.deadLettered(reason)
			errText := ""
			if cause != nil {
				errText = errorText(cause)
			}
			p.log.Warn("message dead-lettered", slog.String("id", id), slog.Int64("offset", rec.Offset),
				slog.String("reason", reason), slog.Int("attempts", attempts), slog.String("dead_letter_topic", topic),
				slog.String("error", errText))
			return true
		}
		if p.stopCtx.Err() != nil {
			return false
		}
		p.metrics.deadLetterError()
		wait := backoff.Delay(n, cfg.RetryBackoff, cfg.RetryBackoffMax)
		p.log.Error("cannot write dead letter; retrying (the message stays uncommitted until it is written)",
			slog.String("id", id), slog.Int64("offset", rec.Offset), slog.String("dead_letter_topic", topic),
			slog.Duration("retry_in", wait), slog.String("error", err.Error()))
		if !p.sleep(wait) {
			return false
		}
	}
}
