package rabbitmq

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/payloadid"
	"github.com/ferryhq/ferry/outbox"
)

// MaxMessageBytesDefault is the largest message the relay sends when it is
// not told the broker's max_message_size: RabbitMQ 4.x's default (3.10's is
// 128 MiB), so that the default fits every supported version.
const MaxMessageBytesDefault = 16 << 20

// HeaderCreatedAt carries the record's timestamp (the outbox row's
// created_at) in RFC 3339 with milliseconds: AMQP's own timestamp property
// has whole seconds only.
const HeaderCreatedAt = outbox.ReservedHeaderPrefix + "created_at"

// Errors of records a broker can never take, and of publishes it did not
// take; the relay quarantines the first two and holds the others.
var (
	// ErrMessageTooLarge: the body and headers exceed the broker's
	// max_message_size.
	ErrMessageTooLarge = errors.New("message larger than the broker's max_message_size")
	// ErrInvalidRecord: a name AMQP cannot carry (a header name, message
	// id or exchange name over 255 bytes), or a header twice.
	ErrInvalidRecord = errors.New("record AMQP 0-9-1 cannot carry")
	// ErrUnroutable: the broker returned the message (mandatory): no queue
	// is bound to the exchange with its routing key.
	ErrUnroutable = errors.New("unroutable: no queue bound for the routing key")
	// ErrExchangeMissing: the exchange does not exist.
	ErrExchangeMissing = errors.New("exchange does not exist")
	// ErrAccessRefused: the user may not write to the exchange.
	ErrAccessRefused = errors.New("access refused")
	// ErrConsumerQueuesMissing: a consumer the relay must not publish
	// past has no queue for a shard of the exchange.
	ErrConsumerQueuesMissing = errors.New("a required consumer's shard queue does not exist")
)

// Publishing is the message of a record: the exchange is the record's topic
// and the routing key the shard of its key (the aggregate id); the id
// header is also the message id (returns are matched on it) and the event
// type the type. Every record header becomes an AMQP header of the same
// name. user, when set, is the validated user id (the broker checks it is
// the connection's user), which tells Ferry's relay apart from other
// producers. It refuses a record AMQP cannot carry or over maxBytes.
func Publishing(rec *kgo.Record, shards int, user string, maxBytes int) (routingKey string, p amqp.Publishing, err error) {
	if len(rec.Topic) > MaxNameBytes {
		return "", p, fmt.Errorf("%w: exchange name of %d bytes", ErrInvalidRecord, len(rec.Topic))
	}
	h := make(amqp.Table, len(rec.Headers)+1)
	size := len(rec.Value)
	for _, rh := range rec.Headers {
		if len(rh.Key) > MaxNameBytes || rh.Key == "" {
			return "", p, fmt.Errorf("%w: header name of %d bytes", ErrInvalidRecord, len(rh.Key))
		}
		if _, dup := h[rh.Key]; dup {
			return "", p, fmt.Errorf("%w: header %q twice", ErrInvalidRecord, rh.Key)
		}
		h[rh.Key] = string(rh.Value)
		size += len(rh.Key) + len(rh.Value)
		switch rh.Key {
		case outbox.HeaderID:
			p.MessageId = string(rh.Value)
		case outbox.HeaderEventType:
			p.Type = string(rh.Value)
		}
	}
	if len(p.MessageId) > MaxNameBytes || len(p.Type) > MaxNameBytes {
		return "", p, fmt.Errorf("%w: id or event type over %d bytes", ErrInvalidRecord, MaxNameBytes)
	}
	if !rec.Timestamp.IsZero() {
		h[HeaderCreatedAt] = rec.Timestamp.UTC().Format(time.RFC3339Nano)
		p.Timestamp = rec.Timestamp
	}
	if size > maxBytes {
		return "", p, fmt.Errorf("%w: %d bytes, limit %d", ErrMessageTooLarge, size, maxBytes)
	}
	p.Headers = h
	p.Body = rec.Value
	p.DeliveryMode = amqp.Persistent
	p.UserId = user
	return RoutingKey(Shard(rec.Key, shards)), p, nil
}

// Record is the record of a delivery from the shard queue of topic: the
// key is the aggregate id header, the partition the shard, the offset the
// delivery tag (increasing on one channel, what the worker acknowledges up
// to), the headers sorted by name (a table has no order).
func Record(d *amqp.Delivery, topic string, shard int) *kgo.Record {
	r := &kgo.Record{
		Topic:     topic,
		Partition: int32(shard),
		Offset:    int64(d.DeliveryTag),
		Value:     d.Body,
		Timestamp: d.Timestamp,
	}
	names := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		names = append(names, k)
	}
	slices.Sort(names)
	r.Headers = make([]kgo.RecordHeader, 0, len(names)+1)
	for _, k := range names {
		v := headerValue(d.Headers[k])
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: v})
		switch k {
		case outbox.HeaderAggregateID:
			r.Key = v
		case HeaderCreatedAt:
			if ts, err := time.Parse(time.RFC3339Nano, string(v)); err == nil {
				r.Timestamp = ts
			}
		}
	}
	if _, ok := d.Headers[outbox.HeaderID]; !ok && d.MessageId != "" {
		// A producer that is not Ferry's: the message id is the id.
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: outbox.HeaderID, Value: []byte(d.MessageId)})
	}
	return r
}

// DerivedID is the id of a delivered message that carries none (no id
// header, no message id): payloadid.OfMessage of its exchange, routing key
// and body. Workers (inbox.Config.IDFromPayloadHash) and the migration
// bridge derive it alike.
func DerivedID(d *amqp.Delivery) string {
	return payloadid.OfMessage(d.Exchange, d.RoutingKey, d.Body)
}

// HasID reports whether a record of a delivery (Record) carries an id.
func HasID(r *kgo.Record) bool {
	for _, h := range r.Headers {
		if h.Key == outbox.HeaderID {
			return true
		}
	}
	return false
}

// headerValue renders an AMQP field as bytes: strings and byte arrays as
// they are, numbers and booleans in decimal, anything else (tables such
// as x-death) with fmt.
func headerValue(v any) []byte {
	switch x := v.(type) {
	case string:
		return []byte(x)
	case []byte:
		return x
	case int, int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		return fmt.Appendf(nil, "%d", x)
	case bool:
		return strconv.AppendBool(nil, x)
	case time.Time:
		return []byte(x.UTC().Format(time.RFC3339))
	case nil:
		return nil
	}
	return fmt.Appendf(nil, "%v", v)
}

// DeathReason is why the broker dead-lettered a delivery (x-first-death-reason:
// "delivery_limit", "rejected", ...), "" when it did not.
func DeathReason(d *amqp.Delivery) string {
	if s, ok := d.Headers["x-first-death-reason"].(string); ok {
		return s
	}
	return ""
}
