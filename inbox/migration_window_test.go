package inbox

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// The shadow report the worker keeps (reportWindow) counts what
// InboxCopyReport counts reading the window whole, report after report:
// random copies of 600 events of two plans (an authoritative copy on
// either side with a shadow, alone, or with a second authoritative copy;
// a shadow alone; digests that differ; copies apart by milliseconds to
// longer than the window), recorded between reports in transactions of their own, some
// long after they came and some before the report's time (a worker's
// clock ahead of another's), their events applied before, with them or
// never.
func TestTheKeptReportCountsWhatTheQueryCounts(t *testing.T) {
	t.Parallel()
	db := ferrytest.NewMigratedDB(t)
	ctx := ferrytest.Context(t, 2*time.Minute)
	q := dbsqlc.New()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(uint64(seed), 25))
	const consumer, steps = "c", 16
	window, allowed, step := 10*time.Minute, 30*time.Second, 3*time.Minute
	base := time.Now().Add(-time.Duration(steps) * step).Truncate(time.Microsecond)
	type insert struct {
		row     dbsqlc.InboxCopyInsertParams
		applied *time.Time // the event's inbox row, written with the copy
	}
	batches := make([][]insert, steps+3) // by the step they are recorded at
	span := time.Duration(steps) * step
	for i := range 600 {
		id := fmt.Sprintf("m-%d", i)
		plan := []string{"p1", "p2"}[rnd.IntN(2)]
		aAt := base.Add(time.Duration(rnd.Int64N(int64(span))))
		apart := time.Duration(rnd.Int64N(int64(5 * time.Second)))
		switch rnd.IntN(20) {
		case 0, 1:
			apart = time.Duration(rnd.Int64N(int64(4 * time.Minute)))
		case 2: // further apart than the window: the first copy is dropped before the second comes
			apart = 12*time.Minute + time.Duration(rnd.Int64N(int64(8*time.Minute)))
		}
		if rnd.IntN(2) == 0 {
			apart = -apart
		}
		sAt := aAt.Add(apart)
		authSide := []string{"old", "new"}[rnd.IntN(2)]
		other := map[string]string{"old": "new", "new": "old"}[authSide]
		digest := []byte{1}
		copyOf := func(side, role string, at time.Time) dbsqlc.InboxCopyInsertParams {
			d := digest
			if role == "shadow" && rnd.IntN(20) == 0 {
				d = []byte{2}
			}
			return dbsqlc.InboxCopyInsertParams{Consumer: consumer, MessageID: id, Plan: plan, Side: side, Role: role, Epoch: 1,
				Digest: d, ReceivedAt: at, Alone: role == "authoritative" && rnd.IntN(15) == 0}
		}
		recordAt := func(at time.Time) int { // the step after it came, up to 2 later, or before (a clock ahead)
			k := int(at.Sub(base)/step) + 1
			switch rnd.IntN(8) {
			case 0, 1:
				k += 1 + rnd.IntN(2)
			case 2:
				k--
			}
			return min(max(k, 0), len(batches)-1)
		}
		processed := aAt.Add(time.Millisecond)
		var applied *time.Time
		switch rnd.IntN(8) {
		case 0: // dead-lettered: never applied
		case 1: // applied long before (a bridged original)
			before := aAt.Add(-time.Minute)
			applied = &before
		default:
			applied = &processed
		}
		kind := rnd.IntN(10)
		if kind != 9 { // 9: a shadow alone
			k := recordAt(aAt)
			batches[k] = append(batches[k], insert{row: copyOf(authSide, "authoritative", aAt), applied: applied})
		}
		switch kind {
		case 7: // no other copy
		case 8: // a second authoritative copy
			k := recordAt(sAt)
			batches[k] = append(batches[k], insert{row: copyOf(other, "authoritative", sAt)})
		default:
			k := recordAt(sAt)
			batches[k] = append(batches[k], insert{row: copyOf(other, "shadow", sAt)})
		}
	}
	w := &reportWindow{}
	plans := []string{"p1", "p2"}
	for k := range steps {
		for _, in := range batches[k] {
			if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				if in.applied != nil {
					if _, err := q.InboxInsert(ctx, tx, dbsqlc.InboxInsertParams{Consumer: consumer, MessageID: in.row.MessageID,
						Now: in.applied}); err != nil {
						return err
					}
				}
				return q.InboxCopyInsert(ctx, tx, in.row)
			}); err != nil {
				t.Fatal(err)
			}
		}
		at := base.Add(time.Duration(k)*step + time.Duration(rnd.Int64N(int64(step))))
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if err := w.update(ctx, q, tx, consumer, plans, at.Add(-window)); err != nil {
				return err
			}
			for _, plan := range plans {
				want, err := q.InboxCopyReport(ctx, tx, dbsqlc.InboxCopyReportParams{Consumer: consumer, Plan: plan, ReportAt: at,
					WindowSeconds: window.Seconds(), AllowedSeconds: allowed.Seconds(), LateBounds: lateBounds})
				if err != nil {
					return err
				}
				got := w.report(plan, at, window, allowed, lateBounds)
				if diff := reportDiff(got, want); diff != "" {
					t.Errorf("report %d of %s: %s\n got %+v\nwant %+v", k, plan, diff, *got, *want)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		w.drop(at.Add(-window - time.Minute))
	}
	if len(w.events) == 0 || len(w.events) >= 600 {
		t.Fatalf("the window holds %d events at the end, want some and not every one", len(w.events))
	}
}

// reportDiff names the figures in which got and want differ.
func reportDiff(got, want *dbsqlc.InboxCopyReportRow) string {
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-6 }
	nearAll := func(a, b []float64) bool {
		if len(a) != len(b) {
			return false
		}
		for i := range a {
			if !near(a[i], b[i]) {
				return false
			}
		}
		return true
	}
	var diff string
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"authoritative", got.Authoritative == want.Authoritative}, {"shadow", got.Shadow == want.Shadow},
		{"checked", got.Checked == want.Checked}, {"mismatched", got.Mismatched == want.Mismatched},
		{"missing", got.Missing == want.Missing}, {"aged", got.Aged == want.Aged},
		{"missing_newest", near(got.MissingNewest, want.MissingNewest)},
		{"late_over", nearAll(got.LateOver, want.LateOver)}, {"late_newest", nearAll(got.LateNewest, want.LateNewest)},
		{"p99", near(got.P99Seconds, want.P99Seconds)}, {"max", near(got.MaxSeconds, want.MaxSeconds)},
		{"duplicates_old", got.DuplicatesOld == want.DuplicatesOld}, {"duplicates_new", got.DuplicatesNew == want.DuplicatesNew},
	} {
		if !f.ok {
			diff += " " + f.name
		}
	}
	return diff
}
