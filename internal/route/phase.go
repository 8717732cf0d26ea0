package route

import (
	"hash/fnv"
	"time"
)

// Phase is where a migration stands (package migration re-exports it as
// migration.Phase, with its constants).
type Phase string

// The phases, in order.
const (
	// OldOnly: the relay writes the old channel only; consumers read it.
	OldOnly Phase = "OLD_ONLY"
	// DualWrite: the relay writes every event to both channels and
	// confirms a WAL position only when both acknowledged it; the old copy
	// is authoritative, consumers compare the new one (shadow).
	DualWrite Phase = "DUAL_WRITE"
	// Cutover: the new copy is authoritative for the aggregates of the
	// slices moved so far, the old one for the rest; the relay still
	// writes both, so a rollback loses nothing.
	Cutover Phase = "CUTOVER"
	// OldRetired: the relay writes the new channel only; consumers drain
	// the old one. There is no way back.
	OldRetired Phase = "OLD_RETIRED"
)

// Slices is how many slices the aggregates are hashed into.
const Slices = 128

// Slice returns the slice of an aggregate, in [0, Slices): a stable hash of
// its id (FNV-1a), the same in every process and release, so that a whole
// aggregate moves at once and its events keep their order. Slices move in
// order: with k slices moved, the aggregates of slices 0 to k-1 are on the
// new channel.
func Slice(aggregateID []byte) int {
	h := fnv.New32a()
	_, _ = h.Write(aggregateID)
	return int(h.Sum32() % Slices)
}

// LateBounds are the bounds of a shadow report's Late marks
// (migration.Report.Late): the workers measure against them.
var LateBounds = []time.Duration{
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 20 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 20 * time.Minute, 30 * time.Minute, time.Hour,
}
