package relay_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// countingSink is the real Kafka client that counts how often each event
// is produced and, while denied is set, answers the records of one topic
// with TOPIC_AUTHORIZATION_FAILED instead of sending them: a missing ACL.
type countingSink struct {
	cl       *kgo.Client
	topic    string
	denied   atomic.Bool
	mu       sync.Mutex
	produced map[string]int
}

func (s *countingSink) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	s.mu.Lock()
	s.produced[header(r, outbox.HeaderID)]++
	s.mu.Unlock()
	if r.Topic == s.topic && s.denied.Load() {
		go promise(r, kerr.TopicAuthorizationFailed)
		return
	}
	s.cl.Produce(ctx, r, promise)
}

func (s *countingSink) AbortBufferedRecords(ctx context.Context) error {
	return s.cl.AbortBufferedRecords(ctx)
}

// republished counts the extra produce calls of the events in ids.
func (s *countingSink) republished(ids []string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		n += max(s.produced[id]-1, 0)
	}
	return n
}

func waitReady(t *testing.T, r *relay.Relay, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := r.Ready()
		if (want == "" && err == nil) || (want != "" && err != nil && strings.Contains(err.Error(), want)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready() = %v after a minute, want %q", err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A topic that does not exist neither restarts the session nor holds the
// relay forever: the other topics flow, nothing is published twice, its
// event is quarantined as unknown_topic after --unknown-topic-wait; and a
// topic created within the wait loses nothing.
func TestUnknownTopicIsHeldThenQuarantined(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 2)
	cfg := b.cfg // the relay's own Kafka client: it asks whether a topic exists
	cfg.UnknownTopicWait = 2 * time.Second
	r := b.start(t, cfg)

	var ids []string
	for i := range 10 {
		ids = append(ids, b.write(t, evt("order", "o", i))...)
	}
	missing := b.write(t, evt("nosuch", "n", 0))
	for i := 10; i < 20; i++ {
		ids = append(ids, b.write(t, evt("order", "o", i))...)
	}
	got := consume(t, []string{topic}, ids, time.Minute, time.Second)
	if d := got.duplicates(); d != 0 {
		t.Errorf("%d duplicates of the other topic's events, want 0", d)
	}
	rows := waitQuarantined(t, b, 1)
	if rows[0].ID.String() != missing[0] || rows[0].Reason != relay.ReasonUnknownTopic {
		t.Fatalf("quarantined %+v, want the nosuch event with reason %s", rows[0], relay.ReasonUnknownTopic)
	}
	if n := r.Stats().Sessions; n != 1 {
		t.Errorf("%d replication sessions, want 1: the refusal must not restart the session", n)
	}

	// Created within the wait, a topic loses nothing.
	late := b.write(t, evt("late", "l", 0), evt("late", "l", 1))
	waitReady(t, r, "unknown topic")
	lateTopic := b.topic(t, "late", 1)
	c := consume(t, []string{lateTopic}, late, time.Minute, time.Second)
	if seqs := []string{header(c.records[0], "seq"), header(c.records[1], "seq")}; seqs[0] != "0" || seqs[1] != "1" {
		t.Errorf("the held events arrived in order %v, want [0 1]", seqs)
	}
	waitReady(t, r, "")
	if rows := quarantine(t, b); len(rows) != 1 {
		t.Fatalf("%d events quarantined, want only the nosuch one", len(rows))
	}
}

// A refused authorization is waited out in place, however long it lasts:
// the other topics flow and are published once, the relay is not ready
// and says why, and once the ACL is fixed the held events arrive in order,
// with no session restart.
func TestAuthorizationFailureIsWaitedOutInPlace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	denied := b.topic(t, "secret", 1)
	open := b.topic(t, "order", 2)
	sink := &countingSink{cl: ferrytest.Client(t), topic: denied, produced: map[string]int{}}
	sink.denied.Store(true)
	cfg := b.cfg
	cfg.Sink = sink
	cfg.UnknownTopicWait = time.Second // must not apply to an authorization failure
	r := b.start(t, cfg)

	var held, flowing []string
	for i := range 5 {
		held = append(held, b.write(t, evt("secret", "s", i))...)
		flowing = append(flowing, b.write(t, evt("order", "o", i))...)
	}
	consume(t, []string{open}, flowing, time.Minute, 0)
	waitReady(t, r, "not authorized")
	time.Sleep(2 * cfg.UnknownTopicWait) // past the unknown-topic wait: still held, not quarantined
	if rows := quarantine(t, b); len(rows) != 0 {
		t.Fatalf("%d events quarantined for an authorization failure, want 0", len(rows))
	}

	sink.denied.Store(false)
	c := consume(t, []string{denied}, held, time.Minute, time.Second)
	for i, rec := range c.records {
		if got := header(rec, "seq"); got != string(rune('0'+i)) {
			t.Fatalf("held event %d arrived with seq %s: out of order", i, got)
		}
	}
	waitReady(t, r, "")
	if n := sink.republished(flowing); n != 0 {
		t.Errorf("the flowing topic's events were produced %d times more than once, want 0", n)
	}
	if n := r.Stats().Sessions; n != 1 {
		t.Errorf("%d replication sessions, want 1: the refusal must not restart the session", n)
	}
}
