package relay_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// The writer's default limit and the relay agree, at the byte, on a topic
// with Kafka's default max.message.bytes: an event with a payload of exactly
// MaxPayloadBytesDefault and ordinary headers is published, and so is the
// largest event the default writer accepts (that payload, headers padded
// until the writer refuses one byte more); the same event one byte larger,
// written with a limit one byte higher, is quarantined as too large.
func TestLargestEventTheWriterAcceptsIsPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	limit := topicMaxMessageBytes(t, b, topic)
	r := b.start(t, b.cfg)

	payload := make([]byte, outbox.MaxPayloadBytesDefault)
	_, _ = rand.Read(payload) // incompressible: the broker sees every byte
	ordinary := outbox.Event{
		AggregateType: "order",
		AggregateID:   uuid.NewString(),
		EventType:     "OrderPlaced",
		Payload:       payload,
		Headers: map[string]string{
			"content-type": "application/json",
			"traceparent":  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		},
	}
	// An ordinary event with a payload at the default limit.
	first := b.write(t, ordinary)[0]
	waitPublished(t, b, topic, first)

	// The largest event the default writer accepts, and one byte more.
	largest := padded(ordinary, largestPad(t, b, outbox.MaxPayloadBytesDefault, ordinary))
	over := padded(ordinary, len(largest.Headers["pad"])+1)
	if accepts(t, b, outbox.MaxPayloadBytesDefault, over) {
		t.Fatal("the default writer accepts the event one byte beyond the largest one it accepts")
	}
	if !accepts(t, b, outbox.MaxPayloadBytesDefault+1, over) {
		t.Fatal("a writer whose limit is one byte higher refuses the event one byte larger than the default's largest")
	}
	t.Logf("topic max.message.bytes %d, payload limit %d, largest event: payload %d, pad header %d bytes",
		limit, outbox.MaxPayloadBytesDefault, len(largest.Payload), len(largest.Headers["pad"]))

	want := append([]string{first}, b.write(t, largest)...)
	w, err := outbox.NewWriter(&outbox.Config{MaxPayloadBytes: outbox.MaxPayloadBytesDefault + 1})
	if err != nil {
		t.Fatal(err)
	}
	overIDs, err := w.Write(b.ctx, b.db.Pool, over)
	if err != nil {
		t.Fatal(err)
	}
	rows := waitQuarantined(t, b, 1)
	for _, q := range rows {
		if q.ID != overIDs[0] {
			t.Fatalf("event %s quarantined (%s: %s); only the one beyond the limit, %s, should be", q.ID, q.Reason, q.Error, overIDs[0])
		}
	}
	if rows[0].Reason != relay.ReasonMessageTooLarge {
		t.Fatalf("event beyond the limit quarantined as %s (%s), want %s", rows[0].Reason, rows[0].Error, relay.ReasonMessageTooLarge)
	}
	c := consume(t, []string{topic}, want, time.Minute, 0)
	for _, rec := range c.records {
		if !bytes.Equal(rec.Value, payload) {
			t.Fatalf("record %s: value of %d bytes, want the %d-byte payload", header(rec, outbox.HeaderID), len(rec.Value), len(payload))
		}
	}
	if n := c.byID[overIDs[0].String()]; n != 0 {
		t.Fatal("the event beyond the topic's limit reached Kafka")
	}
	if st := r.Stats(); st.Quarantined != 1 {
		t.Fatalf("stats %+v, want 1 quarantined", st)
	}
}

// waitPublished waits until the event id reached topic, and fails the test
// as soon as anything is quarantined.
func waitPublished(t *testing.T, b *bundle, topic, id string) {
	t.Helper()
	cl := ferrytest.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	deadline := time.Now().Add(time.Minute)
	for {
		if rows := quarantine(t, b); len(rows) > 0 {
			t.Fatalf("event %s quarantined (%s: %s), want it published", rows[0].ID, rows[0].Reason, rows[0].Error)
		}
		if time.Now().After(deadline) {
			t.Fatalf("event %s neither published nor quarantined after a minute", id)
		}
		ctx, cancel := context.WithTimeout(b.ctx, 500*time.Millisecond)
		fetches := cl.PollFetches(ctx)
		cancel()
		found := false
		fetches.EachRecord(func(r *kgo.Record) { found = found || header(r, outbox.HeaderID) == id })
		if found {
			return
		}
	}
}

// topicMaxMessageBytes reads a topic's max.message.bytes and checks that it
// is the broker's default, not an override.
func topicMaxMessageBytes(t *testing.T, b *bundle, topic string) int {
	t.Helper()
	rcs, err := ferrytest.Admin(t).DescribeTopicConfigs(b.ctx, topic)
	if err == nil && len(rcs) == 1 {
		err = rcs[0].Err
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rcs[0].Configs {
		if c.Key == "max.message.bytes" && c.Value != nil {
			if src := c.Source.String(); !strings.HasPrefix(src, "DEFAULT") {
				t.Fatalf("topic %s: max.message.bytes %s comes from %s, want the default", topic, *c.Value, src)
			}
			n, err := strconv.Atoi(*c.Value)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("topic %s has no max.message.bytes", topic)
	return 0
}

// padded returns ev with a header "pad" of n bytes.
func padded(ev outbox.Event, n int) outbox.Event {
	hs := map[string]string{"pad": strings.Repeat("p", n)}
	for k, v := range ev.Headers {
		hs[k] = v
	}
	ev.Headers = hs
	return ev
}

// largestPad finds the longest "pad" header a writer with payload limit
// maxPayload accepts on ev.
func largestPad(t *testing.T, b *bundle, maxPayload int, ev outbox.Event) int {
	t.Helper()
	lo, hi := -1, 1<<20 // accepted at lo (-1: nothing yet), refused at hi
	if accepts(t, b, maxPayload, padded(ev, hi)) {
		t.Fatalf("a writer with payload limit %d accepts a %d-byte header beside a %d-byte payload", maxPayload, hi, len(ev.Payload))
	}
	for lo+1 < hi {
		m := (lo + hi + 1) / 2
		if accepts(t, b, maxPayload, padded(ev, m)) {
			lo = m
		} else {
			hi = m
		}
	}
	if lo < 0 {
		t.Fatalf("a writer with payload limit %d refuses the event even without padding", maxPayload)
	}
	return lo
}

// accepts reports whether a writer with payload limit maxPayload writes ev,
// in a transaction it rolls back.
func accepts(t *testing.T, b *bundle, maxPayload int, ev outbox.Event) bool {
	t.Helper()
	w, err := outbox.NewWriter(&outbox.Config{MaxPayloadBytes: maxPayload})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	_, err = w.Write(b.ctx, tx, ev)
	var ee *outbox.EventError
	switch {
	case err == nil:
		return true
	case errors.As(err, &ee):
		return false
	}
	t.Fatalf("write: %v", err)
	return false
}

// kafkaClients counts the franz-go clients a relay makes and closes, and
// the Produce requests they write.
type kafkaClients struct{ made, closed, produces atomic.Int64 }

func (k *kafkaClients) OnNewClient(*kgo.Client)    { k.made.Add(1) }
func (k *kafkaClients) OnClientClosed(*kgo.Client) { k.closed.Add(1) }
func (k *kafkaClients) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && err == nil { // 0: Produce's API key
		k.produces.Add(1)
	}
}

// A session that fails while a produce request is in flight and never
// answered (the network to Kafka is cut) aborts its buffered records with
// a deadline the abort cannot meet. The relay then closes that client,
// which franz-go may have left invalid, produces through a new one, and
// delivers every event.
func TestRelayDeliversEverythingAfterACutShortAbort(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 2)
	hole := &ferrytest.Blackhole{}
	clients := &kafkaClients{}
	cfg := b.cfg
	cfg.KafkaOpts = append(cfg.KafkaOpts,
		kgo.Dialer(hole.Dial),
		kgo.ProduceRequestTimeout(time.Minute), // longer than the session's abort waits
		kgo.WithHooks(clients))
	r := b.start(t, cfg)

	var want []string
	for i := range 5 {
		want = append(want, b.write(t, evt("order", fmt.Sprint(i), 1))...)
	}
	consume(t, []string{topic}, want, time.Minute, 0)

	sent := clients.produces.Load()
	hole.Cut()
	for i := range 5 {
		want = append(want, b.write(t, evt("order", fmt.Sprint(i), 2))...)
	}
	waitFor(t, "a produce request written after the cut", func() bool { return clients.produces.Load() > sent })

	// PostgreSQL ends the replication connection: the session fails and
	// aborts what it buffered, with an in-flight request never answered.
	var ended bool
	err := b.db.Pool.QueryRow(b.ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, b.slot).Scan(&ended)
	if err != nil || !ended {
		t.Fatalf("terminate the relay's walsender: %v, %v", ended, err)
	}
	hole.Restore()
	waitFor(t, "a new Kafka client in place of the one whose abort was cut short", func() bool {
		return clients.made.Load() == 2 && clients.closed.Load() == 1
	})

	for i := range 5 {
		want = append(want, b.write(t, evt("order", fmt.Sprint(i), 3))...)
	}
	consume(t, []string{topic}, want, time.Minute, 0)
	if st := r.Stats(); st.Sessions < 2 || st.Quarantined != 0 {
		t.Fatalf("stats %+v, want a second session and nothing quarantined", st)
	}
}

// waitFor waits up to a minute for cond.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after a minute, still waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A relay whose KafkaOpts choose no codec sends its batches uncompressed
// (franz-go's own default would be snappy), and one that chooses a codec
// gets it: the relay's default comes before the caller's options.
func TestBatchesGoUncompressedUnlessKafkaOptsChooseACodec(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		opts []kgo.Opt
		want uint8 // the record batch's compression attribute
	}{{"default", nil, 0}, {"lz4", []kgo.Opt{kgo.ProducerBatchCompression(kgo.Lz4Compression())}, 3}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			topic := b.topic(t, "order", 1)
			cfg := b.cfg
			cfg.KafkaOpts = append(append([]kgo.Opt{}, cfg.KafkaOpts...), c.opts...)
			b.start(t, cfg)
			// A payload a codec shrinks: franz-go sends a batch compressed
			// only when that makes it smaller.
			ev := evt("order", "a", 1)
			ev.Payload = bytes.Repeat([]byte(`{"ferry":1}`), 200)
			ids := b.write(t, ev)
			got := consume(t, []string{topic}, ids, 30*time.Second, 0)
			if n := len(got.records); n != 1 {
				t.Fatalf("fetched %d records, want 1", n)
			}
			if a := got.records[0].Attrs.CompressionType(); a != c.want {
				t.Errorf("the batch arrived with codec %d, want %d", a, c.want)
			}
		})
	}
}
