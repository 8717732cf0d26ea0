package inbox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/outbox"
)

// A record carrying one of Ferry's headers twice (a forged event_type next
// to the relay's) is never handed to a handler, which could read either
// copy: it is dead-lettered as undecodable, and the next record is applied.
func TestDuplicatedFerryHeaderIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	forged := b.record("m-forged", "k", 0, 1)
	forged.Headers = append(forged.Headers, kgo.RecordHeader{Key: outbox.HeaderEventType, Value: []byte("OrderPlaced")})
	b.produce(forged, b.record("m-2", "k", 0, 2))
	var calls atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-forged" {
			calls.Add(1)
		}
		return effectHandler(ctx, tx, m)
	}
	b.start(b.newWorker(b.config(), h))
	b.waitCommitted(b.consumer, 0, 2)
	if n := calls.Load(); n != 0 {
		t.Fatalf("the handler saw the record with two event_type headers %d times", n)
	}
	if n := b.effects("m-2"); n != 1 {
		t.Fatalf("m-2 has %d effects, want 1", n)
	}
	dls := b.deadLetters()
	if len(dls) != 1 || dls[0].ID != "m-forged" || dls[0].Reason != ReasonUndecodable || !strings.Contains(dls[0].Error, "event_type") {
		t.Fatalf("dead letters %+v, want m-forged, undecodable, naming event_type", dls)
	}
}

// Redrive trusts a dead letter only as far as its topic allows: a record
// in the dead-letter topic that names another original topic, or lacks
// Ferry's dead-letter reason, is skipped with the reason, never published.
func TestRedriveRefusesForgedDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	other := b.topic + "-payments"
	forge := func(id, original string, reason bool) *kgo.Record {
		r := b.record(id, "k", 0, 1)
		r.Topic, r.Partition = b.dlq, 0
		r.Headers = append(r.Headers,
			kgo.RecordHeader{Key: HeaderDeadLetterOriginalTopic, Value: []byte(original)},
			kgo.RecordHeader{Key: HeaderDeadLetterOriginalPartition, Value: []byte("0")})
		if reason {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderDeadLetterReason, Value: []byte(ReasonPermanent)})
		}
		return r
	}
	b.produce(forge("m-elsewhere", other, true), forge("m-noreason", b.topic, false))
	res, err := Redrive(b.ctx, b.kopts, b.dlq, nil)
	if !errors.Is(err, ErrNoDeadLetter) { // every one it found was skipped
		t.Fatalf("redrive of forged dead letters only: %v, want ErrNoDeadLetter", err)
	}
	if len(res.Redriven) != 0 || len(res.Skipped) != 2 || len(res.SkipReasons) != 2 ||
		!strings.Contains(res.SkipReasons[0], other) || !strings.Contains(res.SkipReasons[1], HeaderDeadLetterReason) {
		t.Fatalf("redrive of forged dead letters: %d redriven, skipped %v; want both skipped with reasons", len(res.Redriven), res.SkipReasons)
	}
}

// A dead-letter topic that is the topic itself would feed every failure
// back to the consumer without end: Run refuses it by name.
func TestRunRefusesADeadLetterTopicThatIsTheTopic(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	cfg.DeadLetterTopic = func(topic string) string { return topic + "" }
	w := b.newWorker(cfg, effectHandler)
	err := w.Run(b.ctx)
	if err == nil || !strings.Contains(err.Error(), "DeadLetterTopic") || !strings.Contains(err.Error(), b.topic) {
		t.Fatalf("Run = %v, want an error naming Config.DeadLetterTopic and the topic", err)
	}
}
