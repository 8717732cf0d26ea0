package demo

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
)

// The foreign producer's messages carry their id as a service that is not
// Ferry's would, in turn in the message id, in the id header or nowhere;
// the id the demo counts each by must be the one a worker reads from the
// delivery (rabbitmq.Record, and rabbitmq.DerivedID when it has none),
// which the bridge gives its copy too. The key is the aggregate, routed to
// its shard as the relay routes it.
func TestForeignMessagesCarryTheIDsWorkersAndTheBridgeRead(t *testing.T) {
	t.Parallel()
	const exchange, shards = "outbox.event.order", 16
	ids := map[string]bool{}
	for i := range 3 * foreignAggregates {
		s, key, p := foreignMessage(i, exchange, shards)
		shard := rabbitmq.Shard([]byte(s.aggregate), shards)
		if key != rabbitmq.RoutingKey(shard) {
			t.Errorf("message %d of %s routed with %q, not its shard's key %q", i, s.aggregate, key, rabbitmq.RoutingKey(shard))
		}
		d := &amqp.Delivery{Exchange: exchange, RoutingKey: key, MessageId: p.MessageId, Headers: p.Headers, Body: p.Body}
		rec := rabbitmq.Record(d, exchange, shard)
		var id, eventType string
		for _, h := range rec.Headers {
			switch h.Key {
			case outbox.HeaderID:
				id = string(h.Value)
			case outbox.HeaderEventType:
				eventType = string(h.Value)
			}
		}
		if s.carrier == carrierNone {
			if rabbitmq.HasID(rec) {
				t.Errorf("message %d carries an id, %q, though its carrier is %s", i, id, s.carrier)
			}
			id = rabbitmq.DerivedID(d)
		}
		switch {
		case s.carrier != idCarrier(i%int(carriers)):
			t.Errorf("message %d: carrier %s, want them in turn", i, s.carrier)
		case id != s.id:
			t.Errorf("message %d (%s): a worker reads id %q, the demo counts %q", i, s.carrier, id, s.id)
		case ids[id]:
			t.Errorf("message %d: id %q given twice", i, id)
		case string(rec.Key) != s.aggregate || eventType != EventForeignNoted:
			t.Errorf("message %d: key %q, event type %q; want %q, %q", i, rec.Key, eventType, s.aggregate, EventForeignNoted)
		case s.seq != i/foreignAggregates+1:
			t.Errorf("message %d: seq %d, want %d", i, s.seq, i/foreignAggregates+1)
		}
		ids[id] = true
	}
}

// foreignRun is a run of the foreign producer as the verdict sees it: six
// notes on two aggregates, half of them published once the bridge's
// queues existed, each applied a millisecond after the one before and
// bridged when published after the bridge was ready.
func foreignRun() (sent []foreignSent, seen map[string]foreignSeen, bridgeReady time.Time) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	bridgeReady = t0.Add(3 * time.Second)
	seen = map[string]foreignSeen{}
	for i := range 6 {
		s := foreignSent{id: string(rune('a' + i)), aggregate: []string{"x", "y"}[i%2], seq: i/2 + 1,
			carrier: idCarrier(i % int(carriers)), confirmed: t0.Add(time.Duration(i) * time.Second)}
		sent = append(sent, s)
		seen[s.id] = foreignSeen{appliedAt: t0.Add(time.Duration(i) * time.Millisecond), bridged: s.confirmed.After(bridgeReady)}
	}
	return sent, seen, bridgeReady
}

// failed names the checks of v that fail.
func failed(v foreignVerdict) []string {
	var out []string
	for _, c := range v.checks() {
		if !c.ok {
			out = append(out, c.name)
		}
	}
	return out
}

func TestForeignVerdictPassesAMessageAppliedOnceEachInOrder(t *testing.T) {
	t.Parallel()
	sent, seen, ready := foreignRun()
	v := judgeForeign(sent, seen, ready, 0)
	if f := failed(v); len(f) > 0 || !v.drained() {
		t.Fatalf("a clean run fails %v (drained %v): %+v", f, v.drained(), v)
	}
	if v.published != 6 || v.applied != 6 || v.aggregates != 2 || v.after != 2 || v.bridgedAfter != 2 || v.before != 4 {
		t.Errorf("figures of a clean run: %+v", v)
	}
	if v.publishedBy != [carriers]int{2, 2, 2} || v.appliedBy != v.publishedBy {
		t.Errorf("by carrier: published %v, applied %v; want 2 of each", v.publishedBy, v.appliedBy)
	}
}

// Each check must see the violation it is named after (negative controls).
func TestForeignVerdictCatchesEachViolation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		spoil  func(sent []foreignSent, seen map[string]foreignSeen) int // returns the strays
		failed []string
	}{
		{"a message lost", func(sent []foreignSent, seen map[string]foreignSeen) int {
			delete(seen, sent[2].id) // x's second of three
			return 0
		}, []string{"M1 foreign messages exactly once"}},
		{"the last note lost", func(sent []foreignSent, seen map[string]foreignSeen) int {
			delete(seen, sent[4].id) // x's last, published once the bridge was ready
			return 0
		}, []string{"M1 foreign messages exactly once", "M2 foreign final state", "foreign messages bridged"}},
		{"a message applied under a second id", func([]foreignSent, map[string]foreignSeen) int { return 1 },
			[]string{"M1 foreign messages exactly once"}},
		{"two notes applied in the wrong order", func(sent []foreignSent, seen map[string]foreignSeen) int {
			a, b := seen[sent[1].id], seen[sent[3].id] // y's first and second
			a.appliedAt, b.appliedAt = b.appliedAt, a.appliedAt
			seen[sent[1].id], seen[sent[3].id] = a, b
			return 0
		}, []string{"order per foreign aggregate"}},
		{"the last note applied before the one before it", func(sent []foreignSent, seen map[string]foreignSeen) int {
			s := seen[sent[5].id] // y's last
			s.appliedAt = seen[sent[1].id].appliedAt.Add(-time.Millisecond)
			seen[sent[5].id] = s
			return 0
		}, []string{"M2 foreign final state", "order per foreign aggregate"}},
		{"a copy the bridge must have made missing", func(sent []foreignSent, seen map[string]foreignSeen) int {
			s := seen[sent[5].id]
			s.bridged = false
			seen[sent[5].id] = s
			return 0
		}, []string{"foreign messages bridged"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sent, seen, ready := foreignRun()
			v := judgeForeign(sent, seen, ready, tc.spoil(sent, seen))
			if got := failed(v); strings.Join(got, ", ") != strings.Join(tc.failed, ", ") {
				t.Errorf("failed %v, want %v: %+v", got, tc.failed, v)
			}
		})
	}
}

// A note bridged before the bridge was known to be ready (it was declaring
// its queues) is fine; one applied in the same transaction as the next
// (the same time) is in order.
func TestForeignVerdictAcceptsEarlyCopiesAndTies(t *testing.T) {
	t.Parallel()
	sent, seen, ready := foreignRun()
	s := seen[sent[0].id]
	s.bridged = true
	seen[sent[0].id] = s
	tie := seen[sent[4].id]
	tie.appliedAt = seen[sent[2].id].appliedAt
	seen[sent[4].id] = tie
	v := judgeForeign(sent, seen, ready, 0)
	if f := failed(v); len(f) > 0 {
		t.Fatalf("fails %v: %+v", f, v)
	}
	if v.bridgedBefore != 1 {
		t.Errorf("%d early copies counted, want 1", v.bridgedBefore)
	}
}

func TestDrainWaitsForTheForeignMessagesAndTheBridgesCopies(t *testing.T) {
	t.Parallel()
	sent, seen, ready := foreignRun()
	delete(seen, sent[0].id)
	if judgeForeign(sent, seen, ready, 0).drained() {
		t.Error("drained with a message not applied")
	}
	sent, seen, ready = foreignRun()
	s := seen[sent[5].id]
	s.bridged = false
	seen[sent[5].id] = s
	if judgeForeign(sent, seen, ready, 0).drained() {
		t.Error("drained with a copy the bridge must have made not received")
	}
}

func TestBridgeStoppedReadsTheCountsOfItsLastStop(t *testing.T) {
	t.Parallel()
	log := `{"time":"2026-01-02T03:04:05Z","level":"INFO","msg":"bridge starting","plan":"p"}
not json
{"time":"2026-01-02T03:04:06Z","level":"INFO","msg":"bridge stopped","copied":3,"derived_ids":1,"commits":0}
{"time":"2026-01-02T03:04:07Z","level":"INFO","msg":"bridge stopped","copied":940,"derived_ids":300,"commits":0}
`
	c, ok := bridgeStopped([]byte(log))
	if !ok || c.Copied != 940 || c.Derived != 300 {
		t.Errorf("bridgeStopped = %+v, %v; want 940 copied, 300 derived", c, ok)
	}
	if _, ok := bridgeStopped([]byte(`{"msg":"bridge starting"}`)); ok {
		t.Error("counts read from a log without its stop")
	}
}

func TestProducersSectionIsTheStatusLinesFromItsHeading(t *testing.T) {
	t.Parallel()
	out := "plan    p\nphase   CUTOVER 128/128\n\n" + producersHeading + " the groups consumed from in the last 24h0m0s:\n" +
		"TOPIC               USER    RECORDS  LAST_SEEN\noutbox.event.order  (none)  972      2026-12-03 19:00:05Z\n"
	got := producersSection(out)
	if !strings.HasPrefix(got, producersHeading) || !strings.Contains(got, "(none)  972") || strings.Contains(got, "phase") {
		t.Errorf("producersSection = %q", got)
	}
	if producersSection("plan    p\nphase   OLD_ONLY\n") != "" {
		t.Error("a section found in an output without one")
	}
}
