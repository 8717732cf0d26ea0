package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/pgerr"
)

// ErrSlotGone means the slot this relay published from no longer exists
// (a failover to a server that does not carry logical slots, a restore, a
// dropped slot) or is not the slot Ferry recorded. A new slot would start at
// "now" and skip every event committed in between, so the relay stops;
// `relay recover` (Relay.Recover) creates a new slot and republishes the
// outbox rows from the gap.
var ErrSlotGone = fmt.Errorf("%w: replication slot gone", ErrFatal)

// recordInterval is how often a streaming relay writes what it confirmed to
// ferry_relay_slot. The record may lag the slot by this much, never lead it;
// recovery republishes from before it.
const recordInterval = 5 * time.Second

// slotRecord is what Ferry knows of a slot it published from.
type slotRecord = dbsqlc.RelaySlotGetRow

// readSlotRecord returns the record of slot, nil when Ferry has none.
func readSlotRecord(ctx context.Context, db dbsqlc.DBTX, slot string) (*slotRecord, error) {
	rec, err := dbsqlc.New().RelaySlotGet(ctx, db, slot)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case pgerr.UndefinedTable(err):
		return nil, fmt.Errorf("%w: table ferry_relay_slot is missing: run `relay schema` (Ferry's migrations)", ErrOutboxMissing)
	case err != nil:
		return nil, fmt.Errorf("read ferry_relay_slot for slot %q: %w", slot, err)
	}
	return rec, nil
}

// recordSlot remembers a slot at lsn: one the relay just created (created),
// with the newest migration step before its start (routeSeq), or one it
// finds without a record (an administrator created it; routeSeq invalid).
// The first slot of the name Ferry created bounds a recovery's check
// (first_created_at, see Recover).
func recordSlot(ctx context.Context, db dbsqlc.DBTX, slot, lsn string, routeSeq pgtype.Int8, created bool) error {
	p := dbsqlc.RelaySlotCreatedParams{SlotName: slot, CreatedLsn: lsn, RouteSeq: routeSeq, Created: created}
	if err := dbsqlc.New().RelaySlotCreated(ctx, db, p); err != nil {
		return fmt.Errorf("record slot %q in ferry_relay_slot: %w", slot, err)
	}
	return nil
}

// slotGoneError explains a recorded slot that no longer exists, or exists
// on another server than the one Ferry published from.
func slotGoneError(slot string, rec *slotRecord, sysid string, exists bool) error {
	since := "no transaction confirmed yet"
	if rec.ConfirmedCommitAt != nil {
		since = "commit time " + rec.ConfirmedCommitAt.UTC().Format(time.RFC3339Nano)
	}
	what := fmt.Sprintf("slot %q no longer exists", slot)
	if exists {
		what = fmt.Sprintf("slot %q exists, but on server %s, not on server %s where Ferry created it and published from it", slot, sysid, rec.SystemIdentifier)
	} else if sysid != rec.SystemIdentifier {
		what += fmt.Sprintf(" on this server (%s; Ferry published from server %s: a restore elsewhere?)", sysid, rec.SystemIdentifier)
	}
	return fmt.Errorf("%w: %s, but this relay published from it up to LSN %s (%s, recorded %s). "+
		"A failover (PostgreSQL before 17 does not carry logical slots to a promoted standby; 17 does only with "+
		"sync_replication_slots on the standby), a restore or a dropped slot "+
		"loses the changes in between; a new slot would start at \"now\" and skip them, so Ferry does not create one by itself. "+
		"Run `relay recover`: it creates a new slot first, then republishes the outbox rows committed since then (duplicates are "+
		"absorbed by the consumers' inboxes), and the relay streams on from the new slot",
		ErrSlotGone, what, rec.ConfirmedLsn, since, rec.UpdatedAt.UTC().Format(time.RFC3339))
}

// slotRecorder writes, every recordInterval, the newest confirmed position
// and commit time of a streaming session to ferry_relay_slot.
type slotRecorder struct {
	db   dbsqlc.DBTX
	slot string
	log  *slog.Logger

	mu      sync.Mutex
	lsn     pglogrepl.LSN
	at      time.Time
	written time.Time // the commit time last written
}

// note keeps the newest confirmed position; run writes it.
func (r *slotRecorder) note(lsn pglogrepl.LSN, at time.Time) {
	r.mu.Lock()
	if lsn > r.lsn {
		r.lsn = lsn
	}
	if at.After(r.at) {
		r.at = at
	}
	r.mu.Unlock()
}

// run writes until ctx ends, and once more on the way out.
func (r *slotRecorder) run(ctx context.Context) {
	t := time.NewTicker(recordInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			r.write(wctx)
			cancel()
			return
		case <-t.C:
			r.write(ctx)
		}
	}
}

func (r *slotRecorder) write(ctx context.Context) {
	r.mu.Lock()
	lsn, at := r.lsn, r.at
	r.mu.Unlock()
	// Only a newer confirmed transaction moves the record: an idle outbox
	// confirming keepalives writes nothing (writing would make WAL, which
	// the next keepalive confirms, forever).
	if lsn == 0 || at.IsZero() || !at.After(r.written) {
		return
	}
	p := dbsqlc.RelaySlotConfirmedParams{SlotName: r.slot, ConfirmedLsn: lsn.String(), ConfirmedCommitAt: &at}
	if _, err := dbsqlc.New().RelaySlotConfirmed(ctx, r.db, p); err != nil {
		// The record only bounds a recovery's starting point: a stale one
		// republishes more, never less. Warn and try again next time.
		r.log.Warn("cannot record the confirmed position in ferry_relay_slot", slog.String("error", err.Error()))
		return
	}
	r.written = at
}
