package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// produceWrites counts the Produce requests a client wrote.
type produceWrites struct{ n atomic.Int64 }

func (w *produceWrites) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && err == nil { // 0: Produce's API key

		w.n.Add(1)
	}
}

// An abort cut short by its context, while a produce request is in flight
// unanswered, leaves a franz-go client in a state its documentation calls
// invalid, with the aborted records still buffered and retried. The sink
// then closes that client, which fails every one of them, and produces
// through a new one.
func TestCutShortAbortReplacesTheClient(t *testing.T) {
	t.Parallel()
	topic := ferrytest.Topic(t, 1)
	hole := &ferrytest.Blackhole{}
	writes := &produceWrites{}
	s, err := newKafkaSink([]kgo.Opt{
		kgo.SeedBrokers(ferrytest.Brokers(t)...),
		kgo.Dialer(hole.Dial),
		kgo.ProduceRequestTimeout(time.Minute), // the silenced request stays in flight
		kgo.WithHooks(writes),
	}, time.Hour, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := ferrytest.Context(t, time.Minute)

	// The client knows the topic and holds its connections.
	if err := produceSync(ctx, s, &kgo.Record{Topic: topic, Value: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	old := s.client()
	sent := writes.n.Load()

	hole.Cut()
	const n = 10
	failed := make(chan error, n)
	for i := range n {
		s.Produce(ctx, &kgo.Record{Topic: topic, Value: fmt.Appendf(nil, "stale %d", i)}, func(_ *kgo.Record, err error) { failed <- err })
	}
	for writes.n.Load() == sent { // wait until the records are in flight
		select {
		case <-ctx.Done():
			t.Fatal("no produce request written after the cut")
		case <-time.After(10 * time.Millisecond):
		}
	}

	cut, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.AbortBufferedRecords(cut); err != nil {
		t.Fatalf("AbortBufferedRecords cut short: %v, want nil once the client is replaced", err)
	}
	if s.client() == old {
		t.Fatal("the sink still holds the client whose abort was cut short")
	}
	for range n {
		select {
		case err := <-failed:
			if err == nil {
				t.Fatal("an aborted record was acknowledged through a silenced connection")
			}
		case <-ctx.Done():
			t.Fatal("records of the replaced client are still buffered: their promises never ran")
		}
	}

	hole.Restore()
	if err := produceSync(ctx, s, &kgo.Record{Topic: topic, Value: []byte("after")}); err != nil {
		t.Fatalf("produce through the new client: %v", err)
	}
}

func produceSync(ctx context.Context, s Sink, r *kgo.Record) error {
	done := make(chan error, 1)
	s.Produce(ctx, r, func(_ *kgo.Record, err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return errors.New("no acknowledgement")
	}
}

// A record is quarantined as too large on its second refusal in a batch,
// or at once when its own bytes exceed the topic's limit; a verdict clears
// its strike, and so does the broker taking it, so the same event requeued
// after the limit was raised, or refused again in another batch, is judged
// afresh: a refusal in a batch first costs a rebuild, not the quarantine.
func TestTooLargeVerdictForgetsEarlierRefusals(t *testing.T) {
	s, err := newKafkaSink(nil, time.Minute, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const topic = "t"
	setLimit := func(n int32) { s.limits.Store(topic, &topicLimit{bytes: n}) }
	rec := func(id string, size int) *kgo.Record {
		return &kgo.Record{Topic: topic, Value: make([]byte, size), Headers: []kgo.RecordHeader{{Key: outbox.HeaderID, Value: []byte(id)}}}
	}
	big, small := rec("big", 10_000), rec("small", 100)

	// The limit was lowered at runtime: the broker refuses a batch the
	// client built to the old limit, then the client learns the new one.
	setLimit(1 << 20)
	for _, r := range []*kgo.Record{big, small} {
		if s.tooLargeAlone(r) {
			t.Fatalf("%s quarantined on its first refusal in a batch", recordID(r))
		}
	}
	setLimit(2048)
	if !s.tooLargeAlone(big) {
		t.Fatal("a record above the topic's limit was not judged too large")
	}
	s.forgive(small) // the broker took it after the rebuild

	// The limit raised, the event requeued: the client's old batch limit
	// refuses it once, which must cost a rebuild, not a second quarantine.
	setLimit(1 << 20)
	if s.tooLargeAlone(big) {
		t.Fatal("a requeued event was quarantined again for a refusal before its first verdict")
	}
	if s.tooLargeAlone(small) {
		t.Fatal("a record the broker took was quarantined on its next refusal in a batch")
	}
	if !s.tooLargeAlone(small) {
		t.Fatal("a record refused twice in a batch was not judged too large")
	}
	if n := s.struck.Load(); n != 1 {
		t.Fatalf("%d strikes remembered, want 1 (the requeued event's)", n)
	}
}
