package relay

import (
	"testing"

	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// A copy's route header is rendered once per stamp and shared: every value
// is its stamp's String, copies with the same stamp share one value, and
// the cache never holds more than maxStamps.
func TestStampValueRendersEachStampOnce(t *testing.T) {
	rt := &router{stamps: map[route.Stamp][]byte{}}
	a := route.Stamp{Plan: "move-1", Epoch: 3, Slice: 17, Side: route.NewSide, Role: route.Authoritative, Since: 3, Peer: "orders"}
	va := rt.stampValue(a)
	if string(va) != a.String() {
		t.Fatalf("stampValue(%+v) = %q, want %q", a, va, a.String())
	}
	if again := rt.stampValue(a); &again[0] != &va[0] {
		t.Error("a stamp rendered again: copies with the same stamp should share its value")
	}
	b := a
	b.Side, b.Role, b.Since, b.Peer = route.OldSide, route.Shadow, 0, ""
	if got := rt.stampValue(b); string(got) != b.String() {
		t.Errorf("stampValue(%+v) = %q, want %q", b, got, b.String())
	}
	for i := range maxStamps + 10 {
		s := a
		s.Epoch = 4 + i
		if got := rt.stampValue(s); string(got) != s.String() {
			t.Fatalf("stampValue(%+v) = %q, want %q", s, got, s.String())
		}
		if len(rt.stamps) > maxStamps {
			t.Fatalf("%d stamps held, at most %d wanted", len(rt.stamps), maxStamps)
		}
	}
	if got := rt.stampValue(a); string(got) != a.String() {
		t.Errorf("after the cache was cleared, stampValue(%+v) = %q, want %q", a, got, a.String())
	}
}

// The route memo names what the channels' templates name for an event's
// types, follows a change of types, and reports a copy's topic fenced only
// once this session wrote its fences at the step in effect: a fence of an
// earlier step, or of the other channel only, leaves a fence due.
func TestRouteMemoFollowsTypesAndSteps(t *testing.T) {
	rt := &router{
		outs: map[migration.Side]*channelOut{
			migration.OldSide: {side: migration.OldSide, namer: newTopicNamer("{aggregate_type}.events")},
			migration.NewSide: {side: migration.NewSide, namer: newTopicNamer("b.{aggregate_type}.{event_type}")},
		},
		fenced: map[fenceKey]int{},
	}
	rt.setHistory(route.History{{Plan: "p", Epoch: 0, Phase: migration.OldOnly}, {Plan: "p", Epoch: 1, Phase: migration.DualWrite, Slices: 128}})
	both := []route.Copy{{Side: migration.OldSide, Role: route.Authoritative}, {Side: migration.NewSide, Role: route.Shadow}}
	orders := &row{AggregateType: []byte("order"), EventType: []byte("placed")}
	stock := &row{AggregateType: []byte("stock"), EventType: []byte("reserved")}

	for _, r := range []*row{orders, stock, orders} {
		m := rt.memo(r)
		for side, out := range rt.outs {
			if got, want := m.topics[sideIndex(side)], out.namer.topic(r); got != want {
				t.Fatalf("memo of %s/%s names %+v on the %s channel, the template %+v", r.AggregateType, r.EventType, got, side, want)
			}
		}
	}
	placed := &row{AggregateType: []byte("order"), EventType: []byte("cancelled")}
	if got := rt.memo(placed).topics[1].name; got != "b.order.cancelled" {
		t.Fatalf("after a change of event type the new channel's topic is %q, want b.order.cancelled", got)
	}

	m := rt.memo(orders)
	if rt.fencedAll(m, both) {
		t.Fatal("nothing fenced, yet the memo reports both topics fenced")
	}
	rt.fenced[fenceKey{migration.OldSide, "order.events"}] = 0 // a fence of an earlier step
	rt.fenced[fenceKey{migration.NewSide, "b.order.placed"}] = 1
	if rt.fencedAll(m, both) {
		t.Fatal("the old channel's topic was fenced at epoch 0 only, yet the memo reports it fenced at epoch 1")
	}
	if !rt.fencedAll(m, both[1:]) {
		t.Fatal("the new channel's topic was fenced at epoch 1, yet the memo reports a fence due")
	}
	rt.fenced[fenceKey{migration.OldSide, "order.events"}] = 1
	if !rt.fencedAll(m, both) {
		t.Fatal("both topics fenced at epoch 1, yet the memo reports a fence due")
	}
	rt.setHistory(append(rt.history, route.Step{Plan: "p", Epoch: 2, Phase: migration.Cutover, Slices: 128}))
	if rt.fencedAll(rt.memo(orders), both) {
		t.Fatal("a new step needs new fences, yet the memo reports the topics fenced")
	}
}
