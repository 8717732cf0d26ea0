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
