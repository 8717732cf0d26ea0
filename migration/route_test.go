package migration_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/migration"
)

// Every phase routes an event to the channels the design says, the
// authoritative copy first; in CUTOVER the slice decides, so a whole
// aggregate moves at once.
func TestRouteFollowsThePhaseAndTheSlice(t *testing.T) {
	t.Parallel()
	old, nw := migration.OldSide, migration.NewSide
	auth, shadow := migration.Authoritative, migration.Shadow
	var moved, stays []byte // an aggregate in slice < 6, one in a slice >= 6
	for i := 0; moved == nil || stays == nil; i++ {
		id := []byte("agg-" + strings.Repeat("i", i))
		if migration.Slice(id) < 6 {
			moved = id
		} else {
			stays = id
		}
	}
	for _, tc := range []struct {
		step migration.Step
		id   []byte
		want []migration.Copy
	}{
		{migration.Step{Phase: migration.OldOnly}, moved, []migration.Copy{{Side: old, Role: auth}}},
		{migration.Step{Phase: migration.DualWrite}, moved, []migration.Copy{{Side: old, Role: auth}, {Side: nw, Role: shadow}}},
		{migration.Step{Phase: migration.Cutover, Slices: 6}, moved, []migration.Copy{{Side: nw, Role: auth}, {Side: old, Role: shadow}}},
		{migration.Step{Phase: migration.Cutover, Slices: 6}, stays, []migration.Copy{{Side: old, Role: auth}, {Side: nw, Role: shadow}}},
		{migration.Step{Phase: migration.Cutover, Slices: migration.Slices}, stays, []migration.Copy{{Side: nw, Role: auth}, {Side: old, Role: shadow}}},
		{migration.Step{Phase: migration.OldRetired, Slices: migration.Slices}, stays, []migration.Copy{{Side: nw, Role: auth}}},
	} {
		if got := tc.step.Route(tc.id); !slices.Equal(got, tc.want) {
			t.Errorf("%s %d, slice %d: %v, want %v", tc.step.Phase, tc.step.Slices, migration.Slice(tc.id), got, tc.want)
		}
	}
}

// A stamp reads back as written, and a malformed one is refused naming the
// field at fault.
func TestStampRoundTripAndStrictParse(t *testing.T) {
	t.Parallel()
	st := migration.Stamp{Plan: "move-1", Epoch: 3, Slice: 127, Side: migration.NewSide, Role: migration.Shadow}
	got, err := migration.ParseStamp(st.String())
	if err != nil || got != st {
		t.Fatalf("ParseStamp(%q) = %+v, %v", st.String(), got, err)
	}
	for bad, names := range map[string]string{
		"": "fields",
		"plan=move-1;epoch=3;slice=128;side=new;role=shadow":   "slice",
		"plan=move-1;epoch=-1;slice=1;side=new;role=shadow":    "epoch",
		"plan=move-1;epoch=03;slice=1;side=new;role=shadow":    "epoch",
		"plan=Move;epoch=3;slice=1;side=new;role=shadow":       "plan",
		"plan=move-1;epoch=3;slice=1;side=middle;role=shadow":  "side",
		"plan=move-1;epoch=3;slice=1;side=new;role=applied":    "role",
		"epoch=3;plan=move-1;slice=1;side=new;role=shadow":     "field 1",
		"plan=move-1;epoch=3;slice=1;side=new;role=shadow;x=1": "fields",
	} {
		if _, err := migration.ParseStamp(bad); err == nil || !strings.Contains(err.Error(), names) {
			t.Errorf("ParseStamp(%q) = %v, want an error naming %s", bad, err, names)
		}
	}
}

// The stamp is outside input to a consumer: any value parses or is
// refused, never panics, and what parses renders back to itself.
func FuzzParseStamp(f *testing.F) {
	f.Add("plan=move-1;epoch=3;slice=17;side=new;role=authoritative")
	f.Add("plan=a;epoch=0;slice=0;side=old;role=shadow")
	f.Add("plan=;epoch=;slice=;side=;role=")
	f.Fuzz(func(t *testing.T, v string) {
		st, err := migration.ParseStamp(v)
		if err != nil {
			return
		}
		if st.String() != v {
			t.Fatalf("ParseStamp(%q) = %+v, which renders as %q", v, st, st.String())
		}
	})
}
