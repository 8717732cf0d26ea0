package inbox

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/payloadid"
	"github.com/ferryhq/ferry/outbox"
)

// Handler applies one message inside tx, the transaction that also records
// the message in the inbox. Write the effect through tx only, and neither
// commit nor roll it back: the worker commits when Handler returns nil and
// rolls back when it returns an error. Events written with outbox.Write(ctx,
// tx, ...) commit with the effect, so chains stay exactly-once.
//
// A returned error is retried with backoff; wrap it with Permanent (or
// Undecodable) to send the message to the dead-letter topic at once. A
// handler for a message that was already applied is not called.
type Handler func(ctx context.Context, tx pgx.Tx, m *Message) error

// Middleware wraps a Handler with cross-cutting behaviour: logging, tracing,
// timeouts, decoding.
type Middleware func(Handler) Handler

// Chain wraps h with mw; the first middleware is the outermost.
func Chain(h Handler, mw ...Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

// MaxIDLength is the longest message id the inbox accepts, in bytes; a
// longer id header makes the record undecodable.
const MaxIDLength = 256

// Message is one Kafka record as a handler sees it.
type Message struct {
	// ID identifies the message for deduplication: the record's id header
	// (the outbox id for Ferry's relay), stable across republishing,
	// redrive and broker migration. Never the offset.
	ID string

	// Consumer is the name of the consumer applying the message.
	Consumer string

	Topic     string
	Partition int32
	Offset    int64

	// Key is the record key: the aggregate id for Ferry's relay.
	Key []byte

	// Payload is the record value, byte for byte as the outbox stored it.
	Payload []byte

	// Headers are all the record's headers, in order.
	Headers []kgo.RecordHeader

	// EventType, AggregateType and AggregateID come from the headers of
	// the same names; empty when absent.
	EventType     string
	AggregateType string
	AggregateID   string

	// Timestamp is the record's timestamp: the outbox row's created_at for
	// Ferry's relay.
	Timestamp time.Time

	// ReceivedAt is when the worker fetched the record.
	ReceivedAt time.Time

	// Attempt is 1 on the first call of the handler for this message, 2 on
	// the first retry, and so on. It counts calls within one worker
	// process; a message that comes again after a restart starts at 1.
	Attempt int
}

// Header returns the value of the first header named key.
func (m *Message) Header(key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// decodeFailure says why a record cannot become a Message.
type decodeFailure struct {
	reason DeadLetterReason
	err    error
}

// newMessage builds the Message of r. It fails when r has no usable id.
func newMessage(consumer string, r *kgo.Record, hashIDs bool, received time.Time) (*Message, *decodeFailure) {
	m := &Message{
		Consumer:   consumer,
		Topic:      r.Topic,
		Partition:  r.Partition,
		Offset:     r.Offset,
		Key:        r.Key,
		Payload:    r.Value,
		Headers:    r.Headers,
		Timestamp:  r.Timestamp,
		ReceivedAt: received,
	}
	// Ferry's headers must be unambiguous: a record carrying one twice was
	// not written by Ferry's relay (which refuses such rows), and whichever
	// copy a handler read could be the forged one.
	var haveID, haveType, haveAggType, haveAggID bool
	for _, h := range r.Headers {
		var seen *bool
		switch h.Key {
		case outbox.HeaderID:
			m.ID, seen = string(h.Value), &haveID
		case outbox.HeaderEventType:
			m.EventType, seen = string(h.Value), &haveType
		case outbox.HeaderAggregateType:
			m.AggregateType, seen = string(h.Value), &haveAggType
		case outbox.HeaderAggregateID:
			m.AggregateID, seen = string(h.Value), &haveAggID
		default:
			continue
		}
		if *seen {
			return nil, &decodeFailure{ReasonUndecodable, fmt.Errorf("header %q appears more than once: Ferry's headers must be unambiguous", h.Key)}
		}
		*seen = true
	}
	switch {
	case !haveID || m.ID == "":
		if !hashIDs {
			return nil, &decodeFailure{ReasonMissingID, fmt.Errorf("record has no %q header", outbox.HeaderID)}
		}
		m.ID = payloadid.Of(r.Key, r.Value)
	case len(m.ID) > MaxIDLength:
		return nil, &decodeFailure{ReasonUndecodable, fmt.Errorf("%q header is %d bytes, limit %d", outbox.HeaderID, len(m.ID), MaxIDLength)}
	case !utf8.ValidString(m.ID) || strings.ContainsRune(m.ID, 0):
		return nil, &decodeFailure{ReasonUndecodable, fmt.Errorf("%q header is not valid UTF-8 text", outbox.HeaderID)}
	}
	return m, nil
}
