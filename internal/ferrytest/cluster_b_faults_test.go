//go:build faults

package ferrytest_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// Stopping cluster B (scripts/stack kafka-b-stop) leaves cluster A serving,
// and kafka-b-start brings B back with its data: the migration's fault runs
// stop either broker alone.
func TestFaultKafkaBStopLeavesAAnswering(t *testing.T) {
	ctx := ferrytest.Context(t, 3*time.Minute)
	onA := ferrytest.Topic(t, 1)
	onB := ferrytest.TopicB(t, 1)
	clB := ferrytest.ClientB(t)
	if err := clB.ProduceSync(ctx, &kgo.Record{Topic: onB, Value: []byte("before the stop")}).FirstErr(); err != nil {
		t.Fatalf("produce to B: %v", err)
	}

	ferrytest.Stack(t, "kafka-b-stop")
	t.Cleanup(func() { ferrytest.Stack(t, "kafka-b-start") })

	// B is down: a ping that A would answer at once fails.
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := ferrytest.ClientB(t).Ping(pingCtx)
	cancel()
	if err == nil {
		t.Fatal("cluster B answered a ping after kafka-b-stop")
	}
	// A is up: it takes a record and hands it back.
	if err := ferrytest.Client(t).ProduceSync(ctx, &kgo.Record{Topic: onA, Value: []byte("while B is down")}).FirstErr(); err != nil {
		t.Fatalf("produce to A while B is stopped: %v", err)
	}
	got := consumeOne(t, ferrytest.Client(t, kgo.ConsumeTopics(onA), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
	if string(got.Value) != "while B is down" {
		t.Fatalf("consumed %q from A, want \"while B is down\"", got.Value)
	}

	ferrytest.Stack(t, "kafka-b-start")
	// B is back with what it held before the stop.
	got = consumeOne(t, ferrytest.ClientB(t, kgo.ConsumeTopics(onB), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
	if string(got.Value) != "before the stop" {
		t.Fatalf("consumed %q from B after kafka-b-start, want \"before the stop\"", got.Value)
	}
}
