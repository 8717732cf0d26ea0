package inbox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A dead letter redriven after the bug is fixed takes effect once; redriving
// it again is skipped by the inbox.
func TestRedriveAfterFixHasOneEffect(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.produce(b.record("m-bug", "k", 1, 1), b.record("m-ok", "k2", 0, 2))
	var fixed atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-bug" && !fixed.Load() {
			return Permanent(errors.New("bug #12: cannot handle this order"))
		}
		return effectHandler(ctx, tx, m)
	}
	w := b.newWorker(b.config(), h)
	b.start(w)
	b.waitCommitted(b.consumer, 1, 1)
	if n := b.effects("m-bug"); n != 0 {
		t.Fatalf("m-bug has %d effects before the fix", n)
	}

	before := time.Now().Add(-time.Hour)
	listed, err := ListDeadLetters(b.ctx, b.kopts, b.dlq, &DeadLetterFilter{IDs: []string{"m-bug"}, Since: before})
	if err != nil || len(listed) != 1 || listed[0].Reason != ReasonPermanent || listed[0].OriginalPartition != 1 {
		t.Fatalf("listed %+v, %v: want m-bug's dead letter from partition 1", listed, err)
	}
	if none, _ := ListDeadLetters(b.ctx, b.kopts, b.dlq, &DeadLetterFilter{Until: before}); len(none) != 0 {
		t.Fatalf("filter by time: %+v, want none", none)
	}

	fixed.Store(true)
	res, err := Redrive(b.ctx, b.kopts, b.dlq, &DeadLetterFilter{IDs: []string{"m-bug"}})
	if err != nil || len(res.Redriven) != 1 {
		t.Fatalf("redrive: %+v, %v", res, err)
	}
	b.waitFor("the redriven message's effect", func() (bool, error) { return b.effects("m-bug") == 1, nil })
	b.waitCommitted(b.consumer, 1, 2)

	dupsBefore := w.Stats().Duplicates
	if _, err := Redrive(b.ctx, b.kopts, b.dlq, nil); err != nil {
		t.Fatal(err)
	}
	b.waitCommitted(b.consumer, 1, 3)
	if got := w.Stats().Duplicates; got != dupsBefore+1 {
		t.Errorf("second redrive: %d duplicates skipped, want %d", got, dupsBefore+1)
	}
	if n := b.effects("m-bug"); n != 1 {
		t.Errorf("m-bug has %d effects after two redrives, want 1", n)
	}
	if n := b.effects("m-ok"); n != 1 {
		t.Errorf("m-ok has %d effects, want 1", n)
	}
}

// deadLetter is a dead letter of b.topic's partition 0 as a worker writes
// it, from consumer, for the topic original (b.topic for a genuine one).
func (b *bundle) deadLetter(id, consumer, original string) *kgo.Record {
	r := b.record(id, "k-"+id, 0, 1)
	r.Topic, r.Partition = b.dlq, 0
	r.Headers = append(r.Headers,
		kgo.RecordHeader{Key: HeaderDeadLetterReason, Value: []byte(ReasonPermanent)},
		kgo.RecordHeader{Key: HeaderDeadLetterConsumer, Value: []byte(consumer)},
		kgo.RecordHeader{Key: HeaderDeadLetterFailedAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		kgo.RecordHeader{Key: HeaderDeadLetterOriginalTopic, Value: []byte(original)},
		kgo.RecordHeader{Key: HeaderDeadLetterOriginalPartition, Value: []byte("0")})
	return r
}

// published is how many records b.topic holds.
func (b *bundle) published() int64 {
	b.t.Helper()
	ends, err := kadm.NewClient(b.producer).ListEndOffsets(b.ctx, b.topic)
	if err != nil {
		b.t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// A redrive that finds nothing to republish for what it was asked fails
// with ErrNoDeadLetter, naming what it did not find, and republishes
// nothing: an id not in the topic (alone, or beside one that is), a
// filter that matches none, a selection whose every dead letter is
// skipped. Redriving all of an empty topic has nothing to find, and is
// no failure.
func TestRedriveThatFindsNothingFails(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	if res, err := Redrive(b.ctx, b.kopts, b.dlq, nil); err != nil || len(res.Redriven)+len(res.Skipped) != 0 {
		t.Fatalf("redrive of an empty dead-letter topic: %+v, %v; want nothing and no error", res, err)
	}
	b.produce(b.deadLetter("m-1", "billing", b.topic), b.deadLetter("m-forged", "billing", b.topic+"-payments"))
	for _, c := range []struct {
		name   string
		filter *DeadLetterFilter
		want   string
	}{
		{"an id not in the topic", &DeadLetterFilter{IDs: []string{"m-nosuch"}}, `"m-nosuch"`},
		{"an id not in the topic beside one that is", &DeadLetterFilter{IDs: []string{"m-1", "m-nosuch"}}, `"m-nosuch"`},
		{"an id whose dead letter is skipped", &DeadLetterFilter{IDs: []string{"m-forged"}}, `"m-forged"`},
		{"a consumer with no dead letter", &DeadLetterFilter{Consumer: "nosuch"}, "no dead letter matches"},
		{"a time with no dead letter", &DeadLetterFilter{Until: time.Now().Add(-24 * time.Hour)}, "no dead letter matches"},
		{"a consumer whose only redrivable one is another id", &DeadLetterFilter{Consumer: "billing", IDs: []string{"m-forged"}}, `"m-forged"`},
	} {
		res, err := Redrive(b.ctx, b.kopts, b.dlq, c.filter)
		if !errors.Is(err, ErrNoDeadLetter) || !strings.Contains(err.Error(), c.want) || len(res.Redriven) != 0 {
			t.Errorf("redrive of %s: %+v, %v; want ErrNoDeadLetter naming %s, nothing redriven", c.name, res, err, c.want)
		}
	}
	if n := b.published(); n != 0 {
		t.Fatalf("%d records republished by redrives that found nothing", n)
	}
	// Every dead letter of the whole topic skipped but one, then all of them.
	if res, err := Redrive(b.ctx, b.kopts, b.dlq, nil); err != nil || len(res.Redriven) != 1 || len(res.Skipped) != 1 {
		t.Fatalf("redrive of the whole topic: %+v, %v; want m-1 redriven, m-forged skipped", res, err)
	}
	b2 := setup(t, 1)
	b2.produce(b2.deadLetter("m-forged", "billing", b2.topic+"-payments"))
	if res, err := Redrive(b2.ctx, b2.kopts, b2.dlq, nil); !errors.Is(err, ErrNoDeadLetter) || !strings.Contains(err.Error(), "skipped") ||
		len(res.Skipped) != 1 {
		t.Fatalf("redrive of a topic whose every dead letter is skipped: %+v, %v; want ErrNoDeadLetter saying all were skipped", res, err)
	}
}
