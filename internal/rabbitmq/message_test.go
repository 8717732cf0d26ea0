package rabbitmq

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/outbox"
)

func record() *kgo.Record {
	return &kgo.Record{
		Topic: "outbox.event.order",
		Key:   []byte("order-7"),
		Value: []byte(`{"n":1}`),
		Headers: []kgo.RecordHeader{
			{Key: outbox.HeaderID, Value: []byte("0190-id")},
			{Key: outbox.HeaderEventType, Value: []byte("order.placed")},
			{Key: outbox.HeaderAggregateType, Value: []byte("order")},
			{Key: outbox.HeaderAggregateID, Value: []byte("order-7")},
			{Key: "traceparent", Value: []byte("00-abc")},
		},
		Timestamp: time.Date(2026, 12, 2, 6, 0, 0, 123e6, time.UTC),
	}
}

// TestPublishingRoundTrip checks that a record survives the trip through a
// message: what the worker rebuilds has the relay's id, key, value, headers
// and millisecond timestamp, and the shard the routing key named.
func TestPublishingRoundTrip(t *testing.T) {
	t.Parallel()
	rec := record()
	rk, p, err := Publishing(rec, 16, "ferry-relay", MaxMessageBytesDefault)
	if err != nil {
		t.Fatal(err)
	}
	if want := RoutingKey(Shard(rec.Key, 16)); rk != want {
		t.Fatalf("routing key %q, want %q", rk, want)
	}
	if p.MessageId != "0190-id" || p.Type != "order.placed" || p.DeliveryMode != amqp.Persistent || p.UserId != "ferry-relay" {
		t.Fatalf("properties %+v", p)
	}
	shard, _ := ParseRoutingKey(rk)
	d := &amqp.Delivery{Headers: p.Headers, Body: p.Body, MessageId: p.MessageId, Timestamp: p.Timestamp, DeliveryTag: 9}
	got := Record(d, rec.Topic, shard)
	if string(got.Key) != "order-7" || string(got.Value) != string(rec.Value) || got.Offset != 9 || got.Partition != int32(shard) {
		t.Fatalf("record %+v", got)
	}
	if !got.Timestamp.Equal(rec.Timestamp) {
		t.Fatalf("timestamp %v, want %v", got.Timestamp, rec.Timestamp)
	}
	want := map[string]string{}
	for _, h := range rec.Headers {
		want[h.Key] = string(h.Value)
	}
	for _, h := range got.Headers {
		if h.Key == HeaderCreatedAt {
			continue
		}
		if want[h.Key] != string(h.Value) {
			t.Errorf("header %s = %q, want %q", h.Key, h.Value, want[h.Key])
		}
		delete(want, h.Key)
	}
	if len(want) != 0 {
		t.Errorf("headers lost: %v", want)
	}
}

// TestPublishingRefuses checks the gates before a send: what AMQP cannot
// carry and what the broker would refuse fail with the error the relay
// quarantines on, never reaching the broker (which would close the channel).
func TestPublishingRefuses(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		edit func(r *kgo.Record)
		max  int
		want error
	}{
		"too large":        {func(r *kgo.Record) { r.Value = make([]byte, 2000) }, 1000, ErrMessageTooLarge},
		"long header name": {func(r *kgo.Record) { r.Headers = append(r.Headers, kgo.RecordHeader{Key: strings.Repeat("h", 256)}) }, MaxMessageBytesDefault, ErrInvalidRecord},
		"long id":          {func(r *kgo.Record) { r.Headers[0].Value = []byte(strings.Repeat("i", 256)) }, MaxMessageBytesDefault, ErrInvalidRecord},
		"header twice":     {func(r *kgo.Record) { r.Headers = append(r.Headers, r.Headers[0]) }, MaxMessageBytesDefault, ErrInvalidRecord},
		"long exchange":    {func(r *kgo.Record) { r.Topic = strings.Repeat("t", 256) }, MaxMessageBytesDefault, ErrInvalidRecord},
	} {
		r := record()
		c.edit(r)
		if _, _, err := Publishing(r, 16, "", c.max); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	// Exactly at the limit goes.
	r := record()
	size := len(r.Value)
	for _, h := range r.Headers {
		size += len(h.Key) + len(h.Value)
	}
	if _, _, err := Publishing(r, 16, "", size); err != nil {
		t.Errorf("at the limit: %v", err)
	}
}

func TestQueueName(t *testing.T) {
	t.Parallel()
	q := QueueName("outbox.event.order", 7, "stock.reservation")
	if q != "outbox.event.order.007@stock.reservation" {
		t.Fatalf("QueueName = %q", q)
	}
	topic, shard, consumer, ok := ParseQueueName(q)
	if !ok || topic != "outbox.event.order" || shard != 7 || consumer != "stock.reservation" {
		t.Fatalf("ParseQueueName = %q %d %q %v", topic, shard, consumer, ok)
	}
	for _, bad := range []string{"", "x@y", "outbox.event.order.07@c", "outbox.event.order.007@", "outbox.event.order.999@c"} {
		if _, _, _, ok := ParseQueueName(bad); ok {
			t.Errorf("ParseQueueName(%q) accepted", bad)
		}
	}
	long := &Topology{Consumer: strings.Repeat("c", 250), Topics: []string{"outbox.event.order"}, Shards: 16}
	if err := long.Check(); err == nil || !strings.Contains(err.Error(), "255") {
		t.Errorf("Check of a name over 255 bytes: %v", err)
	}
}

// TestQueueArgsExplicit checks that no queue argument is left to the
// broker's version defaults, and that none discards messages.
func TestQueueArgsExplicit(t *testing.T) {
	t.Parallel()
	a := QueueArgs("outbox.event.order", 50)
	for k, want := range map[string]any{
		"x-queue-type": "quorum", "x-single-active-consumer": true, "x-overflow": "reject-publish",
		"x-delivery-limit": int64(50), "x-dead-letter-exchange": "outbox.event.order.dlx", "x-dead-letter-strategy": "at-least-once",
	} {
		if a[k] != want {
			t.Errorf("%s = %v, want %v", k, a[k], want)
		}
	}
	for _, k := range []string{"x-max-length", "x-max-length-bytes", "x-message-ttl", "x-expires"} {
		if _, ok := a[k]; ok {
			t.Errorf("%s set: a Ferry queue must never discard", k)
		}
	}
}

func TestConnCheck(t *testing.T) {
	t.Parallel()
	n := Names{URL: "--rabbitmq-url", Password: "FERRY_RABBITMQ_PASSWORD", CA: "--rabbitmq-ca-file", CertKey: "--rabbitmq-cert-file"}
	for url, want := range map[string]string{
		"":                         "--rabbitmq-url is empty",
		"amqp://u:secret@h:5672/v": "carries a password: put it in FERRY_RABBITMQ_PASSWORD",
		"http://h":                 "scheme",
		"amqp://":                  "no host",
	} {
		c := &Conn{URL: url}
		err := c.Check(n)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check(%q) = %v, want %q", url, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Check(%q) repeats the password: %v", url, err)
		}
	}
	c := &Conn{URL: "amqp://u@h/v"}
	c.TLS.CA = "/ca.pem"
	if err := c.Check(n); err == nil || !strings.Contains(err.Error(), "amqps") {
		t.Errorf("TLS files with amqp://: %v", err)
	}
	if r := (&Conn{URL: "amqps://u@h:5671/v", Vhost: "w"}).Redacted(); r != "amqps://u@h:5671/w" {
		t.Errorf("Redacted = %q", r)
	}
}
