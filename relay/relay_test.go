package relay_test

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/outbox"
)

// 10,000 events in transactions of 1 to 50 events across 100 aggregates all
// reach Kafka with the right topic, key, value and headers, and each
// aggregate's events arrive in commit order.
func TestPublishesEveryEventInCommitOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topics := []string{b.topic(t, "order", 4), b.topic(t, "payment", 4)}
	b.start(t, b.cfg)

	const total, aggregates, writers = 10_000, 100, 4
	type sent struct {
		ev  outbox.Event
		seq int
	}
	var mu sync.Mutex
	byID := map[string]sent{}
	var ids []string
	var wg sync.WaitGroup
	// Each writer owns its aggregates, so per aggregate the commit order is
	// the order the writer commits in.
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			seqs := map[string]int{}
			for n := 0; n < total/writers; {
				size := min(1+rng.IntN(50), total/writers-n)
				events := make([]outbox.Event, size)
				for i := range events {
					agg := w + writers*rng.IntN(aggregates/writers)
					aggType := [...]string{"order", "payment"}[agg%2]
					aggID := "agg-" + strconv.Itoa(agg)
					seqs[aggID]++
					events[i] = evt(aggType, aggID, seqs[aggID])
				}
				got := b.write(t, events...)
				mu.Lock()
				for i, id := range got {
					byID[id] = sent{events[i], seqs[events[i].AggregateID]}
					ids = append(ids, id)
				}
				mu.Unlock()
				n += size
			}
		}()
	}
	wg.Wait()

	c := consume(t, topics, ids, 2*time.Minute, time.Second)
	lastSeq := map[string]int{}
	for _, rec := range c.records {
		id := rec.Headers[0]
		if id.Key != outbox.HeaderID {
			t.Fatalf("first header %q, want %q", id.Key, outbox.HeaderID)
		}
		s, ok := byID[string(id.Value)]
		if !ok {
			t.Fatalf("record with unknown id %s", id.Value)
		}
		ev := s.ev
		wantTopic := b.prefix + "." + ev.AggregateType
		switch {
		case rec.Topic != wantTopic:
			t.Fatalf("event %s on topic %s, want %s", id.Value, rec.Topic, wantTopic)
		case string(rec.Key) != ev.AggregateID:
			t.Fatalf("event %s key %q, want %q", id.Value, rec.Key, ev.AggregateID)
		case string(rec.Value) != string(ev.Payload):
			t.Fatalf("event %s value %q, want %q", id.Value, rec.Value, ev.Payload)
		case header(rec, outbox.HeaderEventType) != ev.EventType,
			header(rec, outbox.HeaderAggregateType) != ev.AggregateType,
			header(rec, outbox.HeaderAggregateID) != ev.AggregateID,
			header(rec, "seq") != ev.Headers["seq"]:
			t.Fatalf("event %s headers %v do not match %+v", id.Value, rec.Headers, ev)
		case rec.Timestamp.IsZero() || time.Since(rec.Timestamp) > 10*time.Minute:
			t.Fatalf("event %s timestamp %s, want its created_at", id.Value, rec.Timestamp)
		}
		// Records of one key come in partition order, which must be commit order.
		seq, _ := strconv.Atoi(header(rec, "seq"))
		if seq <= lastSeq[ev.AggregateID] {
			t.Fatalf("aggregate %s: seq %d arrived after seq %d", ev.AggregateID, seq, lastSeq[ev.AggregateID])
		}
		lastSeq[ev.AggregateID] = seq
	}
	if len(c.byID) != total {
		t.Fatalf("%d distinct events on Kafka, want %d", len(c.byID), total)
	}
	if d := c.duplicates(); d != 0 {
		t.Fatalf("%d duplicates without any failure, want 0", d)
	}
}
