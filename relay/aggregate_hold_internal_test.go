package relay

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
)

// holdHarness drives an aggregateHold as a session would, recording what it
// sends to Kafka and to quarantine.
type holdHarness struct {
	h           *aggregateHold
	sent        []string // aggregate/name, in the order they went to Kafka
	quarantined []quarantined
	discarded   map[uuid.UUID]bool
	asked       int
	clock       time.Time
	names       map[uuid.UUID]string
}

func newHoldHarness() *holdHarness {
	x := &holdHarness{discarded: map[uuid.UUID]bool{}, clock: time.Unix(1000, 0), names: map[uuid.UUID]string{}}
	x.h = newAggregateHold(slog.New(slog.DiscardHandler))
	x.h.now = func() time.Time { return x.clock }
	x.h.quarantine = func(q quarantined) { x.quarantined = append(x.quarantined, q) }
	x.h.release = func(p *inflight) { x.sent = append(x.sent, x.names[p.row.ID]) }
	x.h.gone = func(_ context.Context, ids []uuid.UUID) ([]uuid.UUID, error) {
		x.asked++
		var gone []uuid.UUID
		for _, id := range ids {
			if x.discarded[id] {
				gone = append(gone, id)
			}
		}
		return gone, nil
	}
	return x
}

// event makes a record of aggregate agg named name (its id is new unless
// given), committed at lsn.
func (x *holdHarness) event(agg, name string, lsn pglogrepl.LSN, id ...uuid.UUID) *inflight {
	p := &inflight{event: event{lsn: lsn}}
	p.row.ID = uuid.New()
	if len(id) > 0 {
		p.row.ID = id[0]
	}
	p.row.AggregateType, p.row.AggregateID = []byte("order"), []byte(agg)
	x.names[p.row.ID] = agg + "/" + name
	return p
}

// publish is session.publish: admitted records go to Kafka at once.
func (x *holdHarness) publish(p *inflight) {
	if x.h.admit(context.Background(), p) {
		x.sent = append(x.sent, x.names[p.row.ID])
	}
}

func (x *holdHarness) quarantinedNames() []string {
	var out []string
	for _, q := range x.quarantined {
		out = append(out, x.names[q.p.row.ID]+":"+string(q.reason))
	}
	return out
}

func expect(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// An aggregate has one record out at a time; once Kafka refuses it for
// good, the records waiting behind it and every later one are quarantined
// behind it, in order, naming it, while other aggregates flow.
func TestHoldQuarantinesLaterEventsBehindARefusedOne(t *testing.T) {
	t.Parallel()
	x := newHoldHarness()
	a1, a2, a3, a4 := x.event("a", "1", 10), x.event("a", "2", 20), x.event("a", "3", 30), x.event("a", "4", 40)
	b1, b2 := x.event("b", "1", 25), x.event("b", "2", 45)
	x.publish(a1)
	x.publish(a2)
	x.publish(b1)
	x.publish(a3)
	expect(t, "sent before any acknowledgement", x.sent, []string{"a/1", "b/1"})

	x.h.acknowledged(a1)
	expect(t, "sent after a/1 is acknowledged", x.sent, []string{"a/1", "b/1", "a/2"})
	x.h.refused(quarantined{p: a2, reason: ReasonMessageTooLarge})
	x.publish(a4)
	x.h.acknowledged(b1)
	x.publish(b2)
	expect(t, "sent", x.sent, []string{"a/1", "b/1", "a/2", "b/2"})
	expect(t, "quarantined", x.quarantinedNames(), []string{"a/2:" + string(ReasonMessageTooLarge), "a/3:" + string(ReasonBehindQuarantined), "a/4:" + string(ReasonBehindQuarantined)})
	for _, q := range x.quarantined[1:] {
		if !strings.Contains(q.err.Error(), a2.row.ID.String()) {
			t.Fatalf("error of %s is %q; want it to name the blocking event %s", x.names[q.p.row.ID], q.err, a2.row.ID)
		}
	}
	if n := x.h.held(); n != 1 {
		t.Fatalf("%d aggregates held, want 1", n)
	}
}

// Requeued events (their ids again, another commit LSN) are published in
// their order and release the aggregate; an event met again at its own
// commit LSN (a restart) stays quarantined.
func TestHoldPublishesRequeuedEventsInOrder(t *testing.T) {
	t.Parallel()
	x := newHoldHarness()
	a1, a2 := x.event("a", "1", 10), x.event("a", "2", 20)
	x.publish(a1)
	x.publish(a2)
	x.h.refused(quarantined{p: a1, reason: ReasonMessageTooLarge})
	x.publish(x.event("a", "1", 10, a1.row.ID)) // the session meets it again
	x.publish(x.event("a", "2", 20, a2.row.ID))
	expect(t, "quarantined", x.quarantinedNames(), []string{"a/1:" + string(ReasonMessageTooLarge), "a/2:" + string(ReasonBehindQuarantined), "a/1:" + string(ReasonBehindQuarantined), "a/2:" + string(ReasonBehindQuarantined)})
	x.quarantined, x.sent = nil, nil

	// The requeue transaction brings both back, in order, then a new one.
	r1, r2, a3 := x.event("a", "1", 90, a1.row.ID), x.event("a", "2", 90, a2.row.ID), x.event("a", "3", 95)
	x.publish(r1)
	x.publish(r2)
	x.publish(a3)
	expect(t, "sent", x.sent, []string{"a/1"})
	x.h.acknowledged(r1)
	x.h.acknowledged(r2)
	expect(t, "sent", x.sent, []string{"a/1", "a/2", "a/3"})
	expect(t, "quarantined", x.quarantinedNames(), nil)
	if n := x.h.held(); n != 0 {
		t.Fatalf("%d aggregates held after the requeue, want 0", n)
	}
}

// A requeued event waits for an event quarantined before it that is still
// held, and goes once that one is discarded.
func TestHoldRequeuedEventWaitsForEarlierOnes(t *testing.T) {
	t.Parallel()
	x := newHoldHarness()
	a1, a2, a3 := x.event("a", "1", 10), x.event("a", "2", 20), x.event("a", "3", 30)
	x.publish(a1)
	x.publish(a2)
	x.publish(a3)
	x.h.refused(quarantined{p: a1, reason: ReasonInvalidRecord})
	x.quarantined = nil

	// a/2 and a/3 requeued while a/1 is still quarantined: behind it again.
	x.publish(x.event("a", "2", 90, a2.row.ID))
	x.publish(x.event("a", "3", 90, a3.row.ID))
	expect(t, "quarantined", x.quarantinedNames(), []string{"a/2:" + string(ReasonBehindQuarantined), "a/3:" + string(ReasonBehindQuarantined)})
	x.quarantined = nil

	// a/1 discarded, then a/2 and a/3 requeued: they go.
	x.discarded[a1.row.ID] = true
	x.publish(x.event("a", "2", 99, a2.row.ID))
	x.publish(x.event("a", "3", 99, a3.row.ID))
	expect(t, "quarantined", x.quarantinedNames(), nil)
	expect(t, "sent", x.sent, []string{"a/1", "a/2"})
}

// A discard leaves no trace in the WAL: the hold asks outbox_quarantine
// when it meets a new event of a held aggregate, at most every holdRecheck.
func TestHoldNoticesADiscard(t *testing.T) {
	t.Parallel()
	x := newHoldHarness()
	a1 := x.event("a", "1", 10)
	x.publish(a1)
	x.h.refused(quarantined{p: a1, reason: ReasonInvalidRecord})
	x.publish(x.event("a", "2", 20))
	asked := x.asked
	x.discarded[a1.row.ID] = true
	x.clock = x.clock.Add(holdRecheck / 2)
	x.publish(x.event("a", "3", 30))
	if x.asked != asked {
		t.Fatalf("asked outbox_quarantine %d times within holdRecheck, want %d", x.asked, asked)
	}
	expect(t, "sent", x.sent, []string{"a/1"})
	x.clock = x.clock.Add(holdRecheck)
	x.publish(x.event("a", "4", 40))
	// a/2 and a/3, quarantined behind a/1, still hold the aggregate.
	expect(t, "sent", x.sent, []string{"a/1"})
	x.discarded[x.quarantined[1].p.row.ID], x.discarded[x.quarantined[2].p.row.ID], x.discarded[x.quarantined[3].p.row.ID] = true, true, true
	x.clock = x.clock.Add(holdRecheck)
	x.publish(x.event("a", "5", 50))
	expect(t, "sent", x.sent, []string{"a/1", "a/5"})
}
