package relay

import (
	"testing"

	"github.com/ferryhq/ferry/internal/route"
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
