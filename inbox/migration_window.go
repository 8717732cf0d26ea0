package inbox

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/internal/dbsqlc"
)

// reportWindow is what a consumer's shadow reports count, kept in the
// worker: the copies of every event that has a copy in the window of a
// report to come. Each report reads only the copies recorded since the one
// before (with the other copy of their event), from a horizon below which
// every transaction had ended, and the events older than the window are
// dropped. Reading the window whole from ferry_inbox_copy every
// MigrationReportInterval read each event about twelve times (a 2-minute
// window every 10 s), some 7 µs of PostgreSQL each time: more than
// applying it costs. The counts are InboxCopyReport's, which tests hold it
// to.
type reportWindow struct {
	started bool
	since   copyHorizon // where the next read starts (InboxCopyEventsSince)
	read    []string    // the plans the first read was of
	events  map[string]*windowEvent
	plans   map[string]string // one string per plan
}

// windowEvent is an event's copies, by side (old, new).
type windowEvent struct {
	copies    [2]windowCopy
	processed int64 // when the inbox applied it, µs since the epoch; 0: not (yet)
}

type windowCopy struct {
	ok     bool
	auth   bool
	alone  bool
	plan   string
	at     int64 // received, µs since the epoch
	digest string
}

// newest is when the event's newest copy came.
func (e *windowEvent) newest() int64 {
	return max(e.copies[0].at, e.copies[1].at)
}

func micros(t time.Time) int64 { return t.UnixMicro() }

// update reads the copies recorded since the last update (at the first,
// those of the events of plans with a copy received after from) into w,
// with the other copy of an event it did not hold.
func (w *reportWindow) update(ctx context.Context, q *dbsqlc.Queries, tx pgx.Tx, consumer string, plans []string, from time.Time) error {
	if w.started && !slices.Equal(w.read, plans) { // a plan learned since: read its window too
		*w = reportWindow{}
	}
	next, err := readHorizon(ctx, q, tx)
	if err != nil {
		return err
	}
	if w.events == nil {
		w.events, w.plans = map[string]*windowEvent{}, map[string]string{}
	}
	if !w.started {
		rows, err := q.InboxCopyEventsReceivedAfter(ctx, tx, dbsqlc.InboxCopyEventsReceivedAfterParams{Consumer: consumer,
			Plans: plans, After: from})
		if err != nil {
			return err
		}
		for _, r := range rows {
			w.add((*dbsqlc.InboxCopiesSinceRow)(r))
		}
	} else {
		rows, err := q.InboxCopiesSince(ctx, tx, dbsqlc.InboxCopiesSinceParams{Consumer: consumer, Since: w.since.xmax,
			Inflight: w.since.inflight})
		if err != nil {
			return err
		}
		fresh := map[string]bool{} // events none of the reads before held
		for _, r := range rows {
			if w.events[r.MessageID] == nil {
				fresh[r.MessageID] = true
			}
			w.add(r)
		}
		// Such an event with one copy may have its other one from before
		// those reads (older than the window then): look it up.
		var ids []string
		for id := range fresh {
			if e := w.events[id]; !e.copies[0].ok || !e.copies[1].ok {
				ids = append(ids, id)
			}
		}
		if len(ids) > 0 {
			others, err := q.InboxCopyEventsOf(ctx, tx, dbsqlc.InboxCopyEventsOfParams{Consumer: consumer, Ids: ids})
			if err != nil {
				return err
			}
			for _, r := range others {
				w.add((*dbsqlc.InboxCopiesSinceRow)(r))
			}
		}
	}
	// An authoritative copy recorded without its event applied (a dead
	// letter) may see it applied later: read those again.
	var unapplied []string
	for id, e := range w.events {
		if e.processed == 0 && (e.copies[0].auth || e.copies[1].auth) {
			unapplied = append(unapplied, id)
		}
	}
	if len(unapplied) > 0 {
		applied, err := q.InboxProcessedAt(ctx, tx, dbsqlc.InboxProcessedAtParams{Consumer: consumer, Ids: unapplied})
		if err != nil {
			return err
		}
		for _, a := range applied {
			w.events[a.MessageID].processed = micros(a.ProcessedAt)
		}
	}
	if !w.started {
		w.read = slices.Clone(plans)
	}
	w.started, w.since = true, next
	return nil
}

// copyHorizon is where a read of the copies recorded from then on starts
// (InboxCopyHorizon): the transactions from xmax on, and those of
// inflight, still running when the read before it was made.
type copyHorizon struct {
	xmax     pgtype.Uint64
	inflight []pgtype.Uint64
}

// add holds copy r of its event.
func (w *reportWindow) add(r *dbsqlc.InboxCopiesSinceRow) {
	e := w.events[r.MessageID]
	if e == nil {
		e = &windowEvent{}
		w.events[r.MessageID] = e
	}
	plan, ok := w.plans[r.Plan]
	if !ok {
		plan = r.Plan
		w.plans[plan] = plan
	}
	e.copies[sideIndex(r.Side)] = windowCopy{ok: true, auth: r.Role == "authoritative", alone: r.Alone, plan: plan,
		at: micros(r.ReceivedAt), digest: string(r.Digest)}
	if r.ProcessedMicros != 0 {
		e.processed = r.ProcessedMicros
	}
}

// readHorizon is where a read of the copies recorded from now on starts,
// taken before the read in tx: what the read misses had not ended. It
// turns JIT off for tx: the reads look rows up one by one, whatever the
// tables hold, and a plan costed for a large table would otherwise be
// compiled first, which costs more than the read.
func readHorizon(ctx context.Context, q *dbsqlc.Queries, tx pgx.Tx) (copyHorizon, error) {
	if _, err := tx.Exec(ctx, "SET LOCAL jit = off"); err != nil {
		return copyHorizon{}, err
	}
	h, err := q.InboxCopyHorizon(ctx, tx)
	return copyHorizon{h.Xmax, h.Inflight}, err
}

func sideIndex(side string) int {
	if side == "new" {
		return 1
	}
	return 0
}

// drop forgets the events whose copies all came at or before before: no
// report from then on counts them, but with a copy recorded later, which
// brings them back with it.
func (w *reportWindow) drop(before time.Time) {
	b := micros(before)
	for id, e := range w.events {
		if e.newest() <= b {
			delete(w.events, id)
		}
	}
}

// report is InboxCopyReport of plan at at over the events w holds.
func (w *reportWindow) report(plan string, at time.Time, window, allowed time.Duration, bounds []float64) *dbsqlc.InboxCopyReportRow {
	atUS := micros(at.Truncate(time.Microsecond))
	lo := atUS - window.Microseconds()
	agedBefore := atUS - allowed.Microseconds()
	row := &dbsqlc.InboxCopyReportRow{}
	var lateness []float64
	newest := make([]int64, len(bounds)) // per bound; 0: none
	var missingNewest int64
	for _, e := range w.events {
		recent := false
		for _, c := range e.copies {
			if !c.ok || c.plan != plan || c.at <= lo || c.at > atUS {
				continue
			}
			recent = true
			if !c.auth {
				row.Shadow++
			}
		}
		if !recent {
			continue
		}
		for side, a := range e.copies {
			if !a.ok || !a.auth || a.at > atUS {
				continue
			}
			s := e.copies[1-side]
			shadow := s.ok && !s.auth && s.at <= atUS
			inWindow := a.at > lo
			aged := !a.alone && a.at < agedBefore
			if inWindow {
				row.Authoritative++
				if aged {
					row.Aged++
				}
				if e.processed != 0 && e.processed < a.at {
					if side == 0 {
						row.DuplicatesOld++
					} else {
						row.DuplicatesNew++
					}
				}
			}
			if !shadow {
				if inWindow && aged {
					row.Missing++
					missingNewest = max(missingNewest, a.at)
				}
				continue
			}
			row.Checked++
			if a.digest != s.digest {
				row.Mismatched++
			}
			late := math.Abs(float64(s.at-a.at)) / 1e6
			lateness = append(lateness, late)
			completed := max(a.at, s.at)
			for i, b := range bounds {
				if late > b {
					newest[i] = max(newest[i], completed)
				}
			}
		}
	}
	if missingNewest != 0 {
		row.MissingNewest = float64(missingNewest) / 1e6
	}
	row.LateOver, row.LateNewest = []float64{}, []float64{}
	order := make([]int, len(bounds))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmpFloat(bounds[a], bounds[b]) })
	for _, i := range order {
		if newest[i] != 0 {
			row.LateOver = append(row.LateOver, bounds[i])
			row.LateNewest = append(row.LateNewest, float64(newest[i])/1e6)
		}
	}
	if len(lateness) > 0 {
		slices.Sort(lateness)
		row.P99Seconds = percentileCont(lateness, 0.99)
		row.MaxSeconds = lateness[len(lateness)-1]
	}
	return row
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// percentileCont is PostgreSQL's percentile_cont(p) of sorted: the value
// at p of the way from the first to the last, interpolated.
func percentileCont(sorted []float64, p float64) float64 {
	pos := p * float64(len(sorted)-1)
	lo := math.Floor(pos)
	i := int(lo)
	if i+1 >= len(sorted) {
		return sorted[i]
	}
	return sorted[i] + (pos-lo)*(sorted[i+1]-sorted[i])
}
