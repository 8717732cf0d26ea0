package migration

import (
	"fmt"

	"github.com/ferryhq/ferry/internal/route"
)

// Phase is where a migration stands. It is the type the relay and the
// workers read the phases as (the constants below are theirs; a test keeps
// them equal).
type Phase = route.Phase

// The phases, in order.
const (
	// OldOnly: the relay writes the old channel only; consumers read it.
	OldOnly Phase = "OLD_ONLY"
	// DualWrite: the relay writes every event to both channels and
	// confirms a WAL position only when both acknowledged it; the old copy
	// is authoritative, consumers compare the new one (shadow).
	DualWrite Phase = "DUAL_WRITE"
	// Cutover: the new copy is authoritative for the aggregates of the
	// slices moved so far (State.Slices of them), the old one for the
	// rest; the relay still writes both, so a rollback loses nothing.
	Cutover Phase = "CUTOVER"
	// OldRetired: the relay writes the new channel only; consumers drain
	// the old one. There is no way back.
	OldRetired Phase = "OLD_RETIRED"
)

// Slices is how many slices the aggregates are hashed into: a stable hash
// of the aggregate id, so that a whole aggregate moves at once and its
// events keep their order. With k slices moved (CUTOVER k), the aggregates
// of slices 0 to k-1 are on the new channel.
const Slices = 128

// Side names a channel of a migration.
type Side = route.Side

// The two sides.
const (
	OldSide Side = "old"
	NewSide Side = "new"
)

// ParsePhase returns the phase named s (as the constants spell it).
func ParsePhase(s string) (Phase, error) {
	switch p := Phase(s); p {
	case OldOnly, DualWrite, Cutover, OldRetired:
		return p, nil
	}
	return "", fmt.Errorf("migration: unknown phase %q (want %s, %s, %s or %s)", s, OldOnly, DualWrite, Cutover, OldRetired)
}
