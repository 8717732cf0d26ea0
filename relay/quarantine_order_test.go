package relay_test

import (
	"bytes"
	"crypto/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// orderBundle is a relay test whose topic takes at most 2 KiB per record,
// so that an event with a 10 KB payload is quarantined until the limit is
// raised.
type orderBundle struct {
	*bundle
	topic string
	names map[string]string // outbox id -> aggregate/seq
}

func setupOrder(t *testing.T) *orderBundle {
	b := setup(t)
	limit := "2048"
	topic := b.prefix + ".blob"
	ferrytest.CreateTopicConfig(t, topic, 1, map[string]*string{"max.message.bytes": &limit})
	b.cfg.TopicConfigRefresh = 100 * time.Millisecond
	return &orderBundle{bundle: b, topic: topic, names: map[string]string{}}
}

// writeOne commits one event of aggregate agg in a transaction of its own;
// big makes it too large for the topic.
func (b *orderBundle) writeOne(t *testing.T, agg string, seq int, big bool) string {
	e := evt("blob", agg, seq)
	if big {
		e.Payload = make([]byte, 10_000)
		_, _ = rand.Read(e.Payload) // incompressible: the broker sees all of it
	}
	id := b.write(t, e)[0]
	b.names[id] = agg + e.Headers["seq"]
	return id
}

// raiseLimit fixes the cause: the topic takes large records from now on.
// It returns once the broker describes the raised limit (the controller
// answers the change before the broker applies it). The relay last learnt
// the limit when it last sent a record of the topic, before the caller's
// consume settled (500 ms) and its quarantine was read, many times
// TopicConfigRefresh ago; the pause after is a margin, not what the test
// waits on.
func (b *orderBundle) raiseLimit(t *testing.T) {
	raised := "1048576"
	admin := ferrytest.Admin(t)
	res, err := admin.AlterTopicConfigs(b.ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &raised}}, b.topic)
	if err == nil {
		_, err = res.On(b.topic, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		rcs, err := admin.DescribeTopicConfigs(b.ctx, b.topic)
		if err == nil {
			var rc kadm.ResourceConfig
			if rc, err = rcs.On(b.topic, nil); err == nil && configValue(rc, "max.message.bytes") == raised {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute the broker does not describe max.message.bytes=%s (%v)", raised, err)
		}
	}
	time.Sleep(2 * b.cfg.TopicConfigRefresh)
}

func configValue(rc kadm.ResourceConfig, key string) string {
	for _, c := range rc.Configs {
		if c.Key == key && c.Value != nil {
			return *c.Value
		}
	}
	return ""
}

// order is the sequence in which aggregate agg's events first reached the
// topic ("a1", "a3", ...): duplicates, which at-least-once allows, count
// where they first arrived.
func (b *orderBundle) order(c *consumed, agg string) []string {
	var out []string
	for _, r := range c.records {
		name := b.names[header(r, outbox.HeaderID)]
		if strings.HasPrefix(name, agg) && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// runUntilStopped runs a relay like bundle.start and returns a function that
// stops it cleanly, for a test that starts another one on the same slot.
func (b *orderBundle) runUntilStopped(t *testing.T, cfg relay.Config) (stop func()) {
	t.Helper()
	r, stopRun := runUntilStopped(t, cfg)
	stop = func() {
		if err := stopRun(); err != nil {
			t.Errorf("relay.Run: %v", err)
		}
	}
	t.Cleanup(stop)
	waitState(t, r, relay.StateStreaming)
	return stop
}

// By default (QuarantineOrderSkip) a quarantined event is skipped: the later
// events of its aggregate are published, and a requeue publishes it after
// them, out of order. This is what docs/guarantees.md says.
func TestQuarantineOrderSkipPublishesRequeuedEventLast(t *testing.T) {
	t.Parallel()
	checkSkipOrder(t, setupOrder(t))
}

// A topic's limit that goes stale between being learnt and the records
// going out (a refresh of 1 ms) changes nothing: the client's batches keep
// the limit learnt, not Kafka's default, so the broker never refuses a
// batch and the small events of the aggregate go out in order; only the
// oversized one is quarantined, and, requeued once the limit is raised, it
// is published (no refusal of an earlier session counts against it).
func TestQuarantineOrderSkipHoldsWhenTheLimitGoesStaleInFlight(t *testing.T) {
	t.Parallel()
	b := setupOrder(t)
	b.cfg.TopicConfigRefresh = time.Millisecond
	checkSkipOrder(t, b)
}

func checkSkipOrder(t *testing.T, b *orderBundle) {
	t.Helper()
	b.start(t, b.cfg)
	a1 := b.writeOne(t, "a", 1, false)
	a2 := b.writeOne(t, "a", 2, true)
	later := []string{b.writeOne(t, "a", 3, false), b.writeOne(t, "a", 4, false), b.writeOne(t, "a", 5, false)}
	c := consume(t, []string{b.topic}, append([]string{a1}, later...), time.Minute, 500*time.Millisecond)
	if c.byID[a2] != 0 {
		t.Fatal("the oversized event reached Kafka")
	}
	if got, want := b.order(c, "a"), []string{"a1", "a3", "a4", "a5"}; !slices.Equal(got, want) {
		t.Fatalf("before the requeue, aggregate a reached Kafka as %v, want %v: its later events flow past the quarantined one", got, want)
	}
	if rows := waitQuarantined(t, b.bundle, 1); len(rows) != 1 || rows[0].ID.String() != a2 || rows[0].Reason != relay.ReasonMessageTooLarge {
		t.Fatalf("quarantine = %+v, want only %s as %s", rows, a2, relay.ReasonMessageTooLarge)
	}

	b.raiseLimit(t)
	if n, err := relay.Requeue(b.ctx, b.db.Pool, nil); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v; want 1", n, err)
	}
	c = consume(t, []string{b.topic}, []string{a2}, time.Minute, 0)
	if got, want := b.order(c, "a"), []string{"a1", "a3", "a4", "a5", "a2"}; !slices.Equal(got, want) {
		t.Fatalf("aggregate a reached Kafka as %v, want %v: the requeued event after the later ones", got, want)
	}
}

// Requeue moves an event with those quarantined behind it (same aggregate,
// reason behind_quarantined) and puts them into the outbox in the order
// they were quarantined, whatever the order of their ids or rows.
func TestRequeueKeepsQuarantineOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	b.start(t, b.cfg)

	ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	slices.SortFunc(ids, func(x, y uuid.UUID) int { return bytes.Compare(y[:], x[:]) }) // a1 has the largest id
	other := uuid.New()
	names := map[string]string{ids[0].String(): "a1", ids[1].String(): "a2", ids[2].String(): "a3", other.String(): "x1"}
	base := time.Now().Add(-time.Minute)
	for _, r := range []struct {
		id     uuid.UUID
		agg    string
		reason relay.QuarantineReason
		after  time.Duration
	}{ // rows written last-quarantined first
		{ids[2], "a", relay.ReasonBehindQuarantined, 3 * time.Second},
		{ids[1], "a", relay.ReasonBehindQuarantined, 2 * time.Second},
		{other, "x", relay.ReasonBehindQuarantined, 4 * time.Second},
		{ids[0], "a", relay.ReasonMessageTooLarge, time.Second},
	} {
		_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO outbox_quarantine
			(id, aggregate_type, aggregate_id, event_type, payload, created_at, topic, reason, error, quarantined_at)
			VALUES ($1, 'order', $2, 'Changed', '{}', $3, $4, $5, 'test', $6)`,
			r.id, r.agg, base, topic, r.reason, base.Add(r.after))
		if err != nil {
			t.Fatal(err)
		}
	}
	if n, err := relay.Requeue(b.ctx, b.db.Pool, []uuid.UUID{ids[0]}); err != nil || n != 3 {
		t.Fatalf("Requeue(a1) = %d, %v; want 3: a1 and the two behind it", n, err)
	}
	want := []string{ids[0].String(), ids[1].String(), ids[2].String()}
	c := consume(t, []string{topic}, want, time.Minute, 500*time.Millisecond)
	var got []string
	for _, r := range c.records {
		got = append(got, names[header(r, outbox.HeaderID)])
	}
	if !slices.Equal(got, []string{"a1", "a2", "a3"}) {
		t.Fatalf("requeued events reached Kafka as %v, want [a1 a2 a3]", got)
	}
	if rows := quarantine(t, b); len(rows) != 1 || rows[0].ID != other {
		t.Fatalf("quarantine = %+v, want only x1: another aggregate's event is not behind a1", rows)
	}
}
