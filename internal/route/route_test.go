package route_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// Every phase routes an event to the channels the design says, the
// authoritative copy first; in CUTOVER the slice decides, so a whole
// aggregate moves at once.
func TestRouteFollowsThePhaseAndTheSlice(t *testing.T) {
	t.Parallel()
	old, nw := route.OldSide, route.NewSide
	auth, shadow := route.Authoritative, route.Shadow
	var moved, stays []byte // an aggregate in slice < 6, one in a slice >= 6
	for i := 0; moved == nil || stays == nil; i++ {
		id := []byte("agg-" + strings.Repeat("i", i))
		if route.Slice(id) < 6 {
			moved = id
		} else {
			stays = id
		}
	}
	for _, tc := range []struct {
		step route.Step
		id   []byte
		want []route.Copy
	}{
		{route.Step{Phase: route.OldOnly}, moved, []route.Copy{{Side: old, Role: auth}}},
		{route.Step{Phase: route.DualWrite}, moved, []route.Copy{{Side: old, Role: auth}, {Side: nw, Role: shadow}}},
		{route.Step{Phase: route.Cutover, Slices: 6}, moved, []route.Copy{{Side: nw, Role: auth}, {Side: old, Role: shadow}}},
		{route.Step{Phase: route.Cutover, Slices: 6}, stays, []route.Copy{{Side: old, Role: auth}, {Side: nw, Role: shadow}}},
		{route.Step{Phase: route.Cutover, Slices: route.Slices}, stays, []route.Copy{{Side: nw, Role: auth}, {Side: old, Role: shadow}}},
		{route.Step{Phase: route.OldRetired, Slices: route.Slices}, stays, []route.Copy{{Side: nw, Role: auth}}},
	} {
		if got := tc.step.Route(tc.id); !slices.Equal(got, tc.want) {
			t.Errorf("%s %d, slice %d: %v, want %v", tc.step.Phase, tc.step.Slices, route.Slice(tc.id), got, tc.want)
		}
	}
}

// A stamp's Bytes are its String, made in one allocation: the relay
// stamps every copy it writes during a migration.
func TestStampBytesAreItsStringInOneAllocation(t *testing.T) {
	for _, st := range []route.Stamp{
		{Plan: "move-1", Epoch: 3, Slice: 127, Side: route.NewSide, Role: route.Shadow},
		{Plan: "a-long-plan-name-of-sixty-three-characters-at-most-0123456789ab", Epoch: 1 << 30, Slice: 127, Side: route.NewSide,
			Role: route.Authoritative, Since: 1 << 30, Peer: strings.Repeat("t", 249), Bridged: true},
	} {
		if got, want := string(st.Bytes()), st.String(); got != want {
			t.Fatalf("Bytes() = %q, String() = %q", got, want)
		}
		if n := testing.AllocsPerRun(100, func() { _ = st.Bytes() }); n != 1 {
			t.Errorf("Bytes() of %q: %.0f allocations, want 1", st.String(), n)
		}
	}
}

// A stamp reads back as written, and a malformed one is refused naming the
// field at fault.
func TestStampRoundTripAndStrictParse(t *testing.T) {
	t.Parallel()
	for _, st := range []route.Stamp{
		{Plan: "move-1", Epoch: 3, Slice: 127, Side: route.NewSide, Role: route.Shadow},
		{Plan: "move-1", Epoch: 5, Slice: 2, Side: route.NewSide, Role: route.Authoritative, Since: 4, Peer: "outbox.event.order"},
		{Plan: "move-1", Epoch: 5, Slice: 2, Side: route.NewSide, Role: route.Authoritative, Since: 5, Peer: "outbox.event.order", Bridged: true},
	} {
		got, err := route.ParseStamp(st.String())
		if err != nil || got != st {
			t.Fatalf("ParseStamp(%q) = %+v, %v", st.String(), got, err)
		}
	}
	for bad, names := range map[string]string{
		"": "fields",
		"plan=move-1;epoch=3;slice=128;side=new;role=shadow;since=0;peer=":                     "slice",
		"plan=move-1;epoch=-1;slice=1;side=new;role=shadow;since=0;peer=":                      "epoch",
		"plan=move-1;epoch=03;slice=1;side=new;role=shadow;since=0;peer=":                      "epoch",
		"plan=Move;epoch=3;slice=1;side=new;role=shadow;since=0;peer=":                         "plan",
		"plan=move-1;epoch=3;slice=1;side=middle;role=shadow;since=0;peer=":                    "side",
		"plan=move-1;epoch=3;slice=1;side=new;role=applied;since=0;peer=":                      "role",
		"epoch=3;plan=move-1;slice=1;side=new;role=shadow;since=0;peer=":                       "field 1",
		"plan=move-1;epoch=3;slice=1;side=new;role=shadow;since=0;peer=;x=1":                   "fields",
		"plan=move-1;epoch=3;slice=1;side=new;role=authoritative;since=4;peer=t":               "since 4 is after epoch 3",
		"plan=move-1;epoch=3;slice=1;side=new;role=authoritative;since=2;peer=":                "since and peer go together",
		"plan=move-1;epoch=3;slice=1;side=new;role=authoritative;since=2;peer=a b":             "peer",
		"plan=move-1;epoch=3;slice=1;side=new;role=shadow;since=0;peer=;origin=bridge":         "a bridged copy",
		"plan=move-1;epoch=3;slice=1;side=new;role=authoritative;since=0;peer=;origin=bridge":  "a bridged copy",
		"plan=move-1;epoch=3;slice=1;side=old;role=authoritative;since=2;peer=t;origin=bridge": "a bridged copy",
		"plan=move-1;epoch=3;slice=1;side=new;role=authoritative;since=2;peer=t;origin=relay":  "fields",
	} {
		_, err := route.ParseStamp(bad)
		if err == nil {
			t.Errorf("ParseStamp(%q) accepted", bad)
			continue
		}
		if problem := err.Error()[strings.Index(err.Error(), bad)+len(bad):]; !strings.Contains(problem, names) {
			t.Errorf("ParseStamp(%q) = %v, want an error naming %s", bad, err, names)
		}
	}
}

// An event has one copy only (no shadow will come) when it is the relay's
// OLD_RETIRED copy or a bridge's copy; never a moved slice's copy.
func TestAloneIsOnlyTheCopiesWithoutShadow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		st    route.Stamp
		alone bool
	}{
		{route.Stamp{Side: route.NewSide, Role: route.Authoritative}, true},
		{route.Stamp{Side: route.NewSide, Role: route.Authoritative, Since: 3, Peer: "t", Bridged: true}, true},
		{route.Stamp{Side: route.NewSide, Role: route.Authoritative, Since: 3, Peer: "t"}, false},
		{route.Stamp{Side: route.OldSide, Role: route.Authoritative}, false},
		{route.Stamp{Side: route.NewSide, Role: route.Shadow}, false},
	} {
		if got := tc.st.Alone(); got != tc.alone {
			t.Errorf("%+v: Alone() = %t, want %t", tc.st, got, tc.alone)
		}
	}
}

// A fence reads back as written; a malformed one is refused.
func TestFenceRoundTripAndStrictParse(t *testing.T) {
	t.Parallel()
	f := route.Fence{Plan: "move-1", Epoch: 4, Side: route.OldSide, Partitions: 6, Peer: "orders.v2"}
	if got, err := route.ParseFence(f.String()); err != nil || got != f {
		t.Fatalf("ParseFence(%q) = %+v, %v", f.String(), got, err)
	}
	for _, bad := range []string{"", "plan=move-1;epoch=4;side=old;partitions=0;peer=t", "plan=move-1;epoch=4;side=old;partitions=6",
		"plan=move-1;epoch=x;side=old;partitions=6;peer=t", "plan=move-1;epoch=4;side=both;partitions=6;peer=t",
		"plan=move-1;epoch=4;side=old;partitions=6;peer="} {
		if _, err := route.ParseFence(bad); err == nil {
			t.Errorf("ParseFence(%q) accepted", bad)
		}
	}
}

// Since is the epoch at which the current authority of a slice began: a
// cutover, a rollback and a cutover again each start a new run; a slice
// that never moved has always been on the old side (0).
func TestHistorySinceFollowsEveryMoveOfASlice(t *testing.T) {
	t.Parallel()
	h := route.History{
		{Epoch: 0, Phase: route.OldOnly},
		{Epoch: 1, Phase: route.DualWrite},
		{Epoch: 2, Phase: route.Cutover, Slices: 6},
		{Epoch: 3, Phase: route.DualWrite},
		{Epoch: 4, Phase: route.Cutover, Slices: 6},
		{Epoch: 5, Phase: route.Cutover, Slices: route.Slices},
		{Epoch: 6, Phase: route.OldRetired},
	}
	for _, tc := range []struct{ through, slice, want int }{
		{1, 3, 0},   // dual write: old all along
		{2, 3, 2},   // moved by the first cutover
		{2, 100, 0}, // not moved
		{3, 3, 3},   // rolled back: old again since 3
		{4, 3, 4},   // moved again
		{5, 100, 5}, // moved by the last cutover step
		{6, 3, 4},   // retirement moves nothing
		{6, 100, 5},
	} {
		if got := h[:tc.through+1].Since(tc.slice); got != tc.want {
			t.Errorf("through epoch %d, slice %d: since %d, want %d", tc.through, tc.slice, got, tc.want)
		}
	}
	if got := (route.History{}).Since(1); got != 0 {
		t.Errorf("empty history: since %d", got)
	}
}

// A copy is alone (written to one channel, no shadow) exactly under
// OLD_RETIRED: stamped as the relay stamps them (since from the history on
// an authoritative copy, but in OLD_RETIRED), no copy of any other phase
// looks alone, since the new channel holds a slice only from an epoch
// after the plan's creation.
func TestOnlyOldRetiredCopiesAreAlone(t *testing.T) {
	t.Parallel()
	h := route.History{
		{Epoch: 0, Phase: route.OldOnly},
		{Epoch: 1, Phase: route.DualWrite},
		{Epoch: 2, Phase: route.Cutover, Slices: 6},
		{Epoch: 3, Phase: route.DualWrite},
		{Epoch: 4, Phase: route.Cutover, Slices: 64},
		{Epoch: 5, Phase: route.Cutover, Slices: route.Slices},
		{Epoch: 6, Phase: route.OldRetired},
	}
	for i := 1; i < len(h); i++ {
		step := h[i]
		for slice := range route.Slices {
			agg := aggregateOfSlice(t, slice)
			copies := step.Route(agg)
			for _, c := range copies {
				st := route.Stamp{Plan: "p", Epoch: step.Epoch, Slice: slice, Side: c.Side, Role: c.Role}
				if c.Role == route.Authoritative && step.Phase != route.OldRetired {
					st.Since = h[:i+1].Since(slice)
				}
				if want := step.Phase == route.OldRetired; st.Alone() != want || (want && len(copies) != 1) {
					t.Fatalf("%s epoch %d, slice %d: copy %+v alone %t of %d copies; want alone only in OLD_RETIRED",
						step.Phase, step.Epoch, slice, c, st.Alone(), len(copies))
				}
			}
		}
	}
}

// aggregateOfSlice finds an aggregate id in slice.
func aggregateOfSlice(t *testing.T, slice int) []byte {
	t.Helper()
	for i := 0; i < 1_000_000; i++ {
		if id := []byte(fmt.Sprintf("agg-%d", i)); route.Slice(id) == slice {
			return id
		}
	}
	t.Fatalf("no aggregate id in slice %d", slice)
	return nil
}

// The stamp is outside input to a consumer: any value parses or is
// refused, never panics, and what parses renders back to itself.
func FuzzParseStamp(f *testing.F) {
	f.Add("plan=move-1;epoch=3;slice=17;side=new;role=authoritative;since=3;peer=orders")
	f.Add("plan=a;epoch=0;slice=0;side=old;role=shadow;since=0;peer=")
	f.Add("plan=;epoch=;slice=;side=;role=;since=;peer=")
	f.Add("plan=move-1;epoch=3;slice=17;side=new;role=authoritative;since=3;peer=orders;origin=bridge")
	f.Add("plan=a;epoch=10;slice=127;side=old;role=shadow;since=0;peer=")
	f.Add("plan=a;epoch=01;slice=128;side=old;role=shadow;since=0;peer=")
	f.Fuzz(func(t *testing.T, v string) {
		st, err := route.ParseStamp(v)
		careful, cerr := route.ParseStampCareful(v)
		if st != careful || fmt.Sprint(err) != fmt.Sprint(cerr) {
			t.Fatalf("ParseStamp(%q) = %+v, %v; its careful reading %+v, %v", v, st, err, careful, cerr)
		}
		for _, s := range []string{st.Plan, st.Peer, v} {
			if route.ValidPlanName(s) != route.PlanName.MatchString(s) || route.ValidTopicName(s) != route.TopicName.MatchString(s) {
				t.Fatalf("%q: the names' checks disagree with their regular expressions", s)
			}
		}
		if err != nil {
			return
		}
		if st.String() != v {
			t.Fatalf("ParseStamp(%q) = %+v, which renders as %q", v, st, st.String())
		}
	})
}

// Slice is stable (the same aggregate id, the same slice, in every
// process and release) and spreads ids over all 128 slices.
func TestSliceIsStableAndSpreads(t *testing.T) {
	t.Parallel()
	if got := route.Slice([]byte("order-42")); got != route.Slice([]byte("order-42")) || got < 0 || got >= route.Slices {
		t.Fatalf("Slice(order-42) = %d", got)
	}
	// Pinned values (FNV-1a 32 modulo 128, computed apart): changing the
	// hash would move aggregates mid-route.
	for id, want := range map[string]int{"": 69, "order-42": 116, "stock-7": 77} {
		if got := route.Slice([]byte(id)); got != want {
			t.Errorf("Slice(%q) = %d, want %d", id, got, want)
		}
	}
	seen := map[int]bool{}
	for i := range 10_000 {
		seen[route.Slice([]byte("agg-"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune(i))))] = true
	}
	if len(seen) != route.Slices {
		t.Fatalf("10,000 ids fell in %d slices, want all %d", len(seen), route.Slices)
	}
}

// Package migration spells out the phases, the sides and the slice count
// for its users; they are these, or the relay and the workers would read
// another plan than the controller wrote.
func TestMigrationSpellsTheSameValues(t *testing.T) {
	t.Parallel()
	for _, p := range [][2]route.Phase{{migration.OldOnly, route.OldOnly}, {migration.DualWrite, route.DualWrite},
		{migration.Cutover, route.Cutover}, {migration.OldRetired, route.OldRetired}} {
		if p[0] != p[1] {
			t.Errorf("migration's phase %q, route's %q", p[0], p[1])
		}
	}
	if migration.OldSide != route.OldSide || migration.NewSide != route.NewSide || migration.Slices != route.Slices {
		t.Errorf("migration's sides %q, %q and %d slices; route's %q, %q and %d",
			migration.OldSide, migration.NewSide, migration.Slices, route.OldSide, route.NewSide, route.Slices)
	}
}
