package migration

import (
	"fmt"
	"strconv"
	"strings"
)

// Side names a channel of a migration.
type Side string

// The two sides.
const (
	OldSide Side = "old"
	NewSide Side = "new"
)

// Role says what a copy of an event is to its consumers.
type Role string

// The roles.
const (
	// Authoritative: the copy consumers apply.
	Authoritative Role = "authoritative"
	// Shadow: the copy consumers only compare (arrival lateness, payload
	// digest) and never apply.
	Shadow Role = "shadow"
)

// Step is a plan's phase at one point of the commit order: an accepted
// change (ferry_migration_step), numbered by its epoch.
type Step struct {
	Plan   string
	Epoch  int
	Phase  Phase
	Slices int // slices moved to the new channel (CUTOVER)
}

// Copy is one record the relay writes for an event.
type Copy struct {
	Side Side
	Role Role
}

// Route returns the copies of an event of aggregateID under s, the
// authoritative one first:
//
//	OLD_ONLY     old (authoritative)
//	DUAL_WRITE   old (authoritative), new (shadow)
//	CUTOVER k    slice < k: new (authoritative), old (shadow); else as DUAL_WRITE
//	OLD_RETIRED  new (authoritative)
func (s Step) Route(aggregateID []byte) []Copy {
	switch s.Phase {
	case DualWrite:
		return []Copy{{OldSide, Authoritative}, {NewSide, Shadow}}
	case Cutover:
		if Slice(aggregateID) < s.Slices {
			return []Copy{{NewSide, Authoritative}, {OldSide, Shadow}}
		}
		return []Copy{{OldSide, Authoritative}, {NewSide, Shadow}}
	case OldRetired:
		return []Copy{{NewSide, Authoritative}}
	}
	return []Copy{{OldSide, Authoritative}}
}

// HeaderRoute names the route stamp every record of a migration carries
// (in Ferry's reserved namespace, so no event can forge it).
const HeaderRoute = "ferry.route"

// Stamp is a record's route: which plan and step routed it, its slice,
// the channel it was written to and its role there.
type Stamp struct {
	Plan  string
	Epoch int
	Slice int
	Side  Side
	Role  Role
}

// String renders the stamp as HeaderRoute's value:
// "plan=move-1;epoch=3;slice=17;side=new;role=authoritative".
func (st Stamp) String() string {
	return "plan=" + st.Plan + ";epoch=" + strconv.Itoa(st.Epoch) + ";slice=" + strconv.Itoa(st.Slice) +
		";side=" + string(st.Side) + ";role=" + string(st.Role)
}

// ParseStamp reads a HeaderRoute value. It is strict: every field once, in
// order, with a valid value; anything else is an error that names the
// problem, since a consumer acts on it.
func ParseStamp(v string) (Stamp, error) {
	var st Stamp
	fields := strings.Split(v, ";")
	want := []string{"plan", "epoch", "slice", "side", "role"}
	if len(fields) != len(want) {
		return st, fmt.Errorf("migration: route stamp %q: want %d fields (%s)", v, len(want), strings.Join(want, ";"))
	}
	for i, f := range fields {
		k, val, ok := strings.Cut(f, "=")
		if !ok || k != want[i] {
			return st, fmt.Errorf("migration: route stamp %q: field %d is %q, want %s=", v, i+1, f, want[i])
		}
		switch k {
		case "plan":
			if !planName.MatchString(val) {
				return st, fmt.Errorf("migration: route stamp %q: plan %q is not a plan name", v, val)
			}
			st.Plan = val
		case "epoch":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 || val != strconv.Itoa(n) {
				return st, fmt.Errorf("migration: route stamp %q: epoch %q", v, val)
			}
			st.Epoch = n
		case "slice":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 || n >= Slices || val != strconv.Itoa(n) {
				return st, fmt.Errorf("migration: route stamp %q: slice %q (want 0 to %d)", v, val, Slices-1)
			}
			st.Slice = n
		case "side":
			if Side(val) != OldSide && Side(val) != NewSide {
				return st, fmt.Errorf("migration: route stamp %q: side %q (want old or new)", v, val)
			}
			st.Side = Side(val)
		case "role":
			if Role(val) != Authoritative && Role(val) != Shadow {
				return st, fmt.Errorf("migration: route stamp %q: role %q (want authoritative or shadow)", v, val)
			}
			st.Role = Role(val)
		}
	}
	return st, nil
}
