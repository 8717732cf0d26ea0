package relay

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/dbsqlc"
)

// The step history of a slot (ferry_relay_slot.route_steps) answers the one
// question a session asks of a live migration when it starts: which step
// was in effect at the position the stream resumes from?
//
// The relay records every step it applies, with the end of the step's
// transaction, before it confirms that transaction (route.go); a new slot
// starts with the newest step before its start, in effect from 0/0. The
// step in effect at a position is then the newest recorded at or before
// it, however many recorded steps lie past it. Several can: the relay
// confirms a step's transaction at its next status update, and may record
// the next step before then; and PostgreSQL writes a slot's confirmed
// position to disk only when the slot's restart_lsn or catalog_xmin moves
// (15 and 16 not even at a clean shutdown), so a restart takes the slot
// back past any number of them. The steps past the position come again in
// the stream, each at its point, and are recorded again at the same
// position.
//
// A step is forgotten once no position it is in effect at can be resumed
// from again: when it is older than the one in effect at the slot's
// restart_lsn, read while no walsender holds the slot. A walsender that
// moves restart_lsn writes it to disk, with a confirmed position at or
// past it, before it goes on; so once it let the slot go, the slot never
// resumes before that restart_lsn, whatever crashes.

// appliedStep is a step recorded with a slot: ferry_migration_step.seq (0:
// none) and the position from which it is in effect.
type appliedStep struct {
	seq int64
	at  pglogrepl.LSN
}

// stepAt returns the step of h (oldest first) in effect at pos: the newest
// in effect at or before it. False when none is.
func stepAt(h []appliedStep, pos pglogrepl.LSN) (int64, bool) {
	var best *appliedStep
	for i := range h {
		if s := &h[i]; s.at <= pos && (best == nil || s.at > best.at || s.at == best.at && s.seq > best.seq) {
			best = s
		}
	}
	if best == nil {
		return 0, false
	}
	return best.seq, true
}

// stepInEffect returns the step in effect on slot at start, the position
// the stream resumes from (startPosition: read once the session holds the
// slot). A slot recorded before the relay followed migrations has no
// history: it is adopted (adoptRoute).
func stepInEffect(ctx context.Context, pool *pgxpool.Pool, slot string, start pglogrepl.LSN) (int64, error) {
	rows, err := dbsqlc.New().RelaySlotSteps(ctx, pool, slot)
	if err != nil {
		return 0, fmt.Errorf("read the migration steps of slot %q: %w", slot, err)
	}
	if len(rows) == 0 {
		return adoptRoute(ctx, pool, slot)
	}
	h := make([]appliedStep, len(rows))
	for i, r := range rows {
		at, err := pglogrepl.ParseLSN(r.Lsn)
		if err != nil {
			return 0, fmt.Errorf("parse the position %q of migration step %d of slot %q: %w", r.Lsn, r.Seq, slot, err)
		}
		h[i] = appliedStep{seq: r.Seq, at: at}
	}
	seq, ok := stepAt(h, start)
	if !ok {
		return 0, fmt.Errorf("%w: slot %q resumes at %s, before every migration step recorded with it (the oldest, %d, is in effect from %s): "+
			"the relay cannot tell which step is in effect there", ErrFatal, slot, start, h[0].seq, h[0].at)
	}
	return seq, nil
}

// recordStep records that step seq is in effect on slot from at.
func recordStep(ctx context.Context, db dbsqlc.DBTX, slot string, seq int64, at pglogrepl.LSN) error {
	n, err := dbsqlc.New().RelaySlotStepApplied(ctx, db, dbsqlc.RelaySlotStepAppliedParams{SlotName: slot, Seq: seq, Lsn: at.String()})
	if err == nil && n == 0 {
		err = fmt.Errorf("slot %q is not in ferry_relay_slot", slot)
	}
	if err != nil {
		return fmt.Errorf("record migration step %d: %w", seq, err)
	}
	return nil
}

// pruneSteps forgets the steps of slot older than the one in effect at its
// restart_lsn, read while no process streamed from the slot (st). A slot
// in use may be saving a new restart_lsn that a crash would undo: it is
// left for the next time.
func pruneSteps(ctx context.Context, db dbsqlc.DBTX, slot string, st *dbsqlc.ReplicationSlotGetRow, log *slog.Logger) {
	if st.Active || st.RestartLsn == "" {
		return
	}
	n, err := dbsqlc.New().RelaySlotStepsPrune(ctx, db, dbsqlc.RelaySlotStepsPruneParams{SlotName: slot, Lsn: st.RestartLsn})
	if err != nil {
		// Steps kept longer cost a row each: warn, try again next session.
		log.Warn("cannot forget the migration steps before the slot's restart_lsn", slog.String("error", err.Error()))
		return
	}
	if n > 0 {
		log.Debug("forgot the migration steps before the slot's restart_lsn", slog.String("restart_lsn", st.RestartLsn))
	}
}
