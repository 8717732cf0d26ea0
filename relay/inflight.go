package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/outbox"
)

// inflight is one event on its way to Kafka, in a single allocation: the
// decoded row, the record and its headers, and what the acknowledgement
// needs. It is also the record's Context (franz-go's field for enriching a
// record), embedding the session's context, which is how the session's one
// promise function finds it without a closure per record.
type inflight struct {
	// Context is the session's, set once: franz-go may read it (a
	// record's Done, while it waits for an unknown topic's partitions)
	// from a goroutine of its own until after the promise, so a recycled
	// inflight keeps it and serves the same session only.
	context.Context
	event
}

// event is what an inflight holds besides its Context: all of it is the
// record's own, cleared when the inflight serves a later event.
type event struct {
	row     row
	rec     kgo.Record
	headers [6]kgo.RecordHeader // Ferry's four and room for two of the row's own
	id      [36]byte
	tx      *txn
	size    int
	commit  time.Time          // PostgreSQL commit time of its transaction
	heard   time.Time          // when the relay received it from the stream
	lsn     pglogrepl.LSN      // commit LSN of its transaction
	seq     uint64             // publication order within the session
	probing atomic.Bool        // sent alone to test a topic Kafka refused (topicGate)
	out     *channelOut        // the channel it is written to
	shadow  bool               // a migration's shadow copy: outside the aggregate hold
	copy    bool               // a further copy of an event (a migration's second): outside the window's record count
	copies  prometheus.Counter // a migration's copy: its counter of ferry_relay_migration_copies_total
	span    trace.Span         // its producer span with Config.TraceEvents (tracing.go); nil otherwise
}

// inflights holds a session's inflights of records the broker
// acknowledged, for its next events: an event's inflight was most of what
// the relay allocated per event, and the garbage collector runs as often as
// the bytes allocated fill the heap's goal.
type inflights struct {
	pool sync.Pool
}

func newInflights(ctx context.Context) *inflights {
	return &inflights{pool: sync.Pool{New: func() any { return &inflight{Context: ctx} }}}
}

// get returns an inflight with an empty event.
func (f *inflights) get() *inflight { return f.pool.Get().(*inflight) }

// put gives p back for a later event. Only the end of a record's life may
// call it: the broker acknowledged it and nothing holds it any more (not
// the sink, which never touches a record after its promise; not an
// aggregate's hold, a topic's gate or a channel's pending copies), and
// whoever sent it reads it no more (routeCopies builds every copy of an
// event before it sends the first).
func (f *inflights) put(p *inflight) {
	p.event = event{}
	f.pool.Put(p)
}

// recycles reports whether sink never touches a record after its promise:
// the relay's own sinks and franz-go's client do not; a Config.Sink of
// another kind may keep what it was given.
func recycles(sink Sink) bool {
	switch sink.(type) {
	case *kafkaSink, *rabbitmqSink, *kgo.Client:
		return true
	}
	return false
}

// fill builds the record from the row: key = aggregate id, value = payload
// bytes unchanged, Ferry's headers then the row's own (then CloudEvents',
// when ce is set), timestamp = created_at.
func (p *inflight) fill(topic string, ce *CloudEvents) {
	r := &p.row
	encodeUUID(&p.id, r.ID)
	hs := append(p.headers[:0],
		kgo.RecordHeader{Key: outbox.HeaderID, Value: p.id[:]},
		kgo.RecordHeader{Key: outbox.HeaderEventType, Value: r.EventType},
		kgo.RecordHeader{Key: outbox.HeaderAggregateType, Value: r.AggregateType},
		kgo.RecordHeader{Key: outbox.HeaderAggregateID, Value: r.AggregateID},
	)
	for _, h := range r.Headers {
		hs = append(hs, kgo.RecordHeader{Key: string(h.Key), Value: h.Value})
	}
	if ce != nil {
		hs = ce.addHeaders(hs, p)
	}
	p.rec = kgo.Record{
		Topic:     topic,
		Key:       r.AggregateID,
		Value:     r.Payload,
		Headers:   hs,
		Timestamp: r.CreatedAt,
		Context:   p,
	}
	p.size = recordSize(&p.rec)
}

// reservedHeader returns the first of the row's own header names that
// Ferry reserves (outbox.IsReservedHeader), or that the CloudEvents mapping
// sets when ce is set.
func (p *inflight) reservedHeader(ce *CloudEvents) (string, bool) {
	for _, h := range p.row.Headers {
		if outbox.IsReservedHeader(string(h.Key)) || ce != nil && reservedCloudEventsHeader(string(h.Key)) {
			return string(h.Key), true
		}
	}
	return "", false
}

const hexDigits = "0123456789abcdef"

// encodeUUID writes the canonical text of a UUID without allocating.
func encodeUUID(dst *[36]byte, u [16]byte) {
	j := 0
	for i, b := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst[j] = '-'
			j++
		}
		dst[j], dst[j+1] = hexDigits[b>>4], hexDigits[b&0x0f]
		j += 2
	}
}
