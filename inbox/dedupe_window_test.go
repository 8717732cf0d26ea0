package inbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// dedupeWindowBundle is a migrated database and the clock its rows are
// dated by.
type dedupeWindowBundle struct {
	t   *testing.T
	ctx context.Context
	db  *ferrytest.DB
	now time.Time
}

func setupDedupeWindow(t *testing.T) *dedupeWindowBundle {
	t.Helper()
	return &dedupeWindowBundle{t: t, ctx: ferrytest.Context(t, time.Minute), db: ferrytest.NewMigratedDB(t), now: time.Now()}
}

// processed inserts n inbox rows of consumer, processed ago.
func (b *dedupeWindowBundle) processed(consumer string, n int, ago time.Duration) {
	b.t.Helper()
	at := b.now.Add(-ago)
	for i := range n {
		id := fmt.Sprintf("%s-%s-%d", consumer, ago, i)
		if _, err := dbsqlc.New().InboxInsert(b.ctx, b.db.Pool, dbsqlc.InboxInsertParams{Consumer: consumer, MessageID: id, Now: &at}); err != nil {
			b.t.Fatal(err)
		}
	}
}

// copies records the two copies of message id as consumer received them:
// on the old channel oldAgo ago, on the new one newAgo ago.
func (b *dedupeWindowBundle) copies(consumer, id string, oldAgo, newAgo time.Duration) {
	b.t.Helper()
	b.copy(consumer, id, "old", oldAgo)
	b.copy(consumer, id, "new", newAgo)
}

func (b *dedupeWindowBundle) copy(consumer, id, side string, ago time.Duration) {
	b.t.Helper()
	err := dbsqlc.New().InboxCopyInsert(b.ctx, b.db.Pool, dbsqlc.InboxCopyInsertParams{
		Consumer: consumer, MessageID: id, Plan: "p", Side: side, Role: "shadow", Epoch: 1,
		Digest: []byte{1}, ReceivedAt: b.now.Add(-ago),
	})
	if err != nil {
		b.t.Fatal(err)
	}
}

func (b *dedupeWindowBundle) inboxRows(consumer string) int64 {
	b.t.Helper()
	n, err := dbsqlc.New().InboxCountByConsumer(b.ctx, b.db.Pool, consumer)
	if err != nil {
		b.t.Fatal(err)
	}
	return n
}

// prune runs a pass as Run does, with metrics, at retention (the safety
// minimum lowered to it).
func (b *dedupeWindowBundle) prune(retention time.Duration) (*PruneResult, *metrics, error) {
	b.t.Helper()
	m := newMetrics(prometheus.NewRegistry())
	c := PruneConfig{InboxRetention: retention, InboxRetentionMin: retention, BatchSize: 2}.WithDefaults()
	if err := c.validate(); err != nil {
		b.t.Fatal(err)
	}
	res, err := prune(b.ctx, b.db.Pool, &c, m)
	return res, m, err
}

func refusedCount(m *metrics, consumer string) float64 {
	var d dto.Metric
	if err := m.pruneRefused.WithLabelValues(consumer).Write(&d); err != nil {
		return -1
	}
	return d.GetCounter().GetValue()
}

// The window is twice the delay, and at least an hour above it.
func TestDedupeWindowRule(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ delay, want time.Duration }{
		{0, time.Hour},
		{10 * time.Minute, 70 * time.Minute},
		{time.Hour, 2 * time.Hour},
		{2 * time.Hour, 4 * time.Hour},
		{3 * 24 * time.Hour, 6 * 24 * time.Hour},
	} {
		if got := dedupeWindow(c.delay); got != c.want {
			t.Errorf("dedupeWindow(%s) = %s, want %s", c.delay, got, c.want)
		}
	}
}

// Copies 2h apart require a 4h window: a prune pass at 1h retention
// deletes none of the consumer's inbox rows, counts the refusal and returns
// an error that names the consumer, the delay, the window and the
// retention; inbox.Prune says the same.
func TestPruneRefusesARetentionBelowTheDedupeWindow(t *testing.T) {
	t.Parallel()
	b := setupDedupeWindow(t)
	b.copies("c", "m-1", 3*time.Hour, 5*time.Hour) // new first, old 2h later
	b.copies("c", "m-2", 5*time.Hour, 5*time.Hour-time.Minute)
	b.processed("c", 5, 3*time.Hour)

	res, m, err := b.prune(time.Hour)
	var dw *DedupeWindowError
	if !errors.Is(err, ErrRetentionTooShort) || !errors.As(err, &dw) {
		t.Fatalf("prune at 1h retention: %v, want a *DedupeWindowError wrapping ErrRetentionTooShort", err)
	}
	want := DedupeWindowError{Consumer: "c", Delay: 2 * time.Hour, Window: 4 * time.Hour, Retention: time.Hour}
	if *dw != want {
		t.Errorf("refusal %+v, want %+v", *dw, want)
	}
	for _, s := range []string{`consumer "c"`, "up to 2h0m0s apart", "dedupe window 4h0m0s", "InboxRetention 1h0m0s", "take effect twice"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if n := b.inboxRows("c"); n != 5 || res.Deleted != 0 {
		t.Errorf("%d inbox rows left of 5, %d reported deleted; want all kept", n, res.Deleted)
	}
	if n := refusedCount(m, "c"); n != 1 {
		t.Errorf("ferry_worker_prune_refused_total{consumer=c} = %v, want 1", n)
	}

	_, err = Prune(b.ctx, b.db.Pool, &PruneConfig{InboxRetention: time.Hour, InboxRetentionMin: time.Hour})
	if !errors.As(err, &dw) || *dw != want {
		t.Errorf("inbox.Prune at 1h retention: %v, want the same refusal", err)
	}
	if n := b.inboxRows("c"); n != 5 {
		t.Errorf("%d inbox rows left of 5 after inbox.Prune", n)
	}
}

// With a retention at or above the window, the consumer is pruned as
// without a migration: expired rows go, younger ones stay.
func TestPruneAboveTheDedupeWindowPrunes(t *testing.T) {
	t.Parallel()
	b := setupDedupeWindow(t)
	b.copies("c", "m-1", 3*time.Hour, 5*time.Hour) // window 4h
	b.processed("c", 5, 6*time.Hour)
	b.processed("c", 3, 3*time.Hour)

	res, m, err := b.prune(4 * time.Hour)
	if err != nil {
		t.Fatalf("prune at 4h retention: %v", err)
	}
	if n := b.inboxRows("c"); n != 3 || res.Deleted != 5 || res.Batches != 3 {
		t.Errorf("%d inbox rows left, result %+v; want 3 left, 5 deleted in 3 batches", n, res)
	}
	if n := refusedCount(m, "c"); n != 0 {
		t.Errorf("ferry_worker_prune_refused_total{consumer=c} = %v, want 0", n)
	}
}

// A consumer's window comes from its own copies only: another consumer's
// long delays, even for the same message ids, neither hold it back nor
// stop the other being refused, and one pass prunes the first and keeps
// the second.
func TestPruneDedupeWindowIsPerConsumer(t *testing.T) {
	t.Parallel()
	b := setupDedupeWindow(t)
	b.copies("slow", "m-1", 3*time.Hour, 5*time.Hour)
	b.copies("fast", "m-2", 3*time.Hour, 3*time.Hour-time.Second)
	// slow received m-2 on the new channel 2h before fast received it on
	// the old: paired across consumers, a 2h delay of fast.
	b.copy("slow", "m-2", "new", 5*time.Hour)
	b.processed("slow", 4, 3*time.Hour)
	b.processed("fast", 4, 3*time.Hour)
	b.processed("none", 4, 3*time.Hour)

	res, m, err := b.prune(2 * time.Hour)
	var dw *DedupeWindowError
	if !errors.As(err, &dw) || dw.Consumer != "slow" || strings.Contains(err.Error(), `"fast"`) {
		t.Fatalf("prune at 2h retention: %v, want the refusal of slow only", err)
	}
	left := map[string]int64{"slow": b.inboxRows("slow"), "fast": b.inboxRows("fast"), "none": b.inboxRows("none")}
	if left["slow"] != 4 || left["fast"] != 0 || left["none"] != 0 || res.Deleted != 8 {
		t.Errorf("inbox rows left %v, %d deleted; want slow's 4 kept, the 8 of fast and none deleted", left, res.Deleted)
	}
	if s, f := refusedCount(m, "slow"), refusedCount(m, "fast"); s != 1 || f != 0 {
		t.Errorf("refusals counted: slow %v, fast %v; want 1, 0", s, f)
	}
}

// Pairs count by the arrival of their later copy: one that ended within
// the lookback counts however long ago its first copy came, one that ended
// before it no longer does.
func TestDedupeWindowLooksBackByTheLaterCopy(t *testing.T) {
	t.Parallel()
	b := setupDedupeWindow(t)
	week := DedupeWindowLookback
	b.copies("ended-long-ago", "m-1", week+time.Hour, week+4*time.Hour)
	b.copies("long-delay", "m-2", week+time.Hour, 3*time.Hour) // 7d-2h apart, the later 3h ago
	b.processed("ended-long-ago", 2, 2*time.Hour)
	b.processed("long-delay", 2, 2*time.Hour)

	_, _, err := b.prune(time.Hour)
	var dw *DedupeWindowError
	if !errors.As(err, &dw) || dw.Consumer != "long-delay" || dw.Delay != week-2*time.Hour || strings.Contains(err.Error(), "ended-long-ago") {
		t.Fatalf("prune at 1h retention: %v, want the refusal of long-delay only, for a delay of %s", err, week-2*time.Hour)
	}
	if n, k := b.inboxRows("ended-long-ago"), b.inboxRows("long-delay"); n != 0 || k != 2 {
		t.Errorf("inbox rows left: ended-long-ago %d, long-delay %d; want 0, 2", n, k)
	}
}

// Without a migration (no copies at all), or with copies on one channel
// only (no delay measured yet), a pass prunes exactly as before.
func TestPruneWithoutCopiesIsUnchanged(t *testing.T) {
	t.Parallel()
	for _, oneSided := range []bool{false, true} {
		t.Run(fmt.Sprintf("one_sided=%t", oneSided), func(t *testing.T) {
			t.Parallel()
			b := setupDedupeWindow(t)
			if oneSided {
				b.copy("c", "m-1", "new", 5*time.Hour)
			}
			b.processed("c", 5, 3*time.Hour)
			b.processed("d", 2, 3*time.Hour)
			b.processed("c", 2, 30*time.Minute)

			res, m, err := b.prune(time.Hour)
			if err != nil {
				t.Fatalf("prune at 1h retention: %v", err)
			}
			// 2+2+2+1 rows of the 7 expired ones.
			if res.Deleted != 7 || res.Batches != 4 {
				t.Errorf("result %+v, want 7 inbox rows in 4 batches", res)
			}
			if c, d := b.inboxRows("c"), b.inboxRows("d"); c != 2 || d != 0 {
				t.Errorf("inbox rows left: c %d, d %d; want the 2 recent ones of c", c, d)
			}
			if n := refusedCount(m, "c"); n != 0 {
				t.Errorf("ferry_worker_prune_refused_total{consumer=c} = %v, want 0", n)
			}
		})
	}
}

// The shadow report counts, per channel, the authoritative copies that
// arrived after their event was applied: the duplicates the inbox blocked
// (a bridged copy, a copy brought again). The copy that was applied, and a
// shadow, are not duplicates.
func TestTheReportCountsDuplicatesBlockedPerChannel(t *testing.T) {
	t.Parallel()
	b := setupDedupeWindow(t)
	q := dbsqlc.New()
	at := func(ago time.Duration) time.Time { return b.now.Add(-ago) }
	insert := func(id, side, role string, ago time.Duration) {
		t.Helper()
		if err := q.InboxCopyInsert(b.ctx, b.db.Pool, dbsqlc.InboxCopyInsertParams{Consumer: "c", MessageID: id, Plan: "p",
			Side: side, Role: role, Epoch: 1, Digest: []byte{1}, ReceivedAt: at(ago)}); err != nil {
			t.Fatal(err)
		}
	}
	applied := func(id string, ago time.Duration) {
		t.Helper()
		when := at(ago)
		if _, err := q.InboxInsert(b.ctx, b.db.Pool, dbsqlc.InboxInsertParams{Consumer: "c", MessageID: id, Now: &when}); err != nil {
			t.Fatal(err)
		}
	}
	// m-1: applied from the old channel, brought again by the new one.
	insert("m-1", "old", "authoritative", 50*time.Second)
	applied("m-1", 49*time.Second)
	insert("m-1", "new", "authoritative", 40*time.Second)
	// m-2: applied from the new channel, its old copy a shadow.
	insert("m-2", "new", "authoritative", 30*time.Second)
	applied("m-2", 29*time.Second)
	insert("m-2", "old", "shadow", 20*time.Second)
	// m-3 and m-4: applied from the new channel, brought again by the old.
	for _, id := range []string{"m-3", "m-4"} {
		insert(id, "new", "authoritative", 15*time.Second)
		applied(id, 14*time.Second)
		insert(id, "old", "authoritative", 5*time.Second)
	}
	row, err := q.InboxCopyReport(b.ctx, b.db.Pool, dbsqlc.InboxCopyReportParams{Consumer: "c", Plan: "p", ReportAt: b.now, AllowedSeconds: 1, WindowSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if row.DuplicatesOld != 2 || row.DuplicatesNew != 1 {
		t.Fatalf("duplicates blocked: old %d, new %d; want 2 and 1", row.DuplicatesOld, row.DuplicatesNew)
	}
}

// copyOf records one copy of message id of plan p as consumer received it
// ago, in role.
func (b *dedupeWindowBundle) copyOf(consumer, id, side, role string, ago time.Duration) {
	b.t.Helper()
	err := dbsqlc.New().InboxCopyInsert(b.ctx, b.db.Pool, dbsqlc.InboxCopyInsertParams{
		Consumer: consumer, MessageID: id, Plan: "p", Side: side, Role: role, Epoch: 1,
		Digest: []byte{1}, ReceivedAt: b.now.Add(-ago),
	})
	if err != nil {
		b.t.Fatal(err)
	}
}

// copiesLeft is the ids of consumer's events with copies, and how many.
func (b *dedupeWindowBundle) copiesLeft(consumer string) map[string]int {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT message_id, count(*)::int FROM ferry_inbox_copy WHERE consumer = $1 GROUP BY message_id`, consumer)
	if err != nil {
		b.t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id string
		n  int
	}, error) {
		var v struct {
			id string
			n  int
		}
		return v, r.Scan(&v.id, &v.n)
	})
	if err != nil {
		b.t.Fatal(err)
	}
	out := map[string]int{}
	for _, v := range left {
		out[v.id] = v.n
	}
	return out
}

// A prune pass deletes the copies of live migrations once nothing needs
// them: every copy of an event settled (its authoritative copy recorded,
// or its inbox row) whose copies all came longer ago than the dedupe
// window's lookback, read a batch at a time. It keeps an event awaiting
// its authoritative copy, one with a copy inside the lookback, the plan's
// first event (the migration's start, InboxCopySince) and every copy of a
// consumer whose prune was refused (as an event with one copy past the
// lookback and the other inside it always is). Before, no copy was ever deleted: two
// rows per message of every migration, for good.
func TestPruneDeletesTheCopiesOfSettledEventsPastTheLookback(t *testing.T) {
	t.Parallel()
	b := setupDedupeWindow(t)
	old := DedupeWindowLookback + 2*time.Hour
	b.copyOf("c", "first", "old", "authoritative", old+3*time.Hour)
	b.copyOf("c", "first", "new", "shadow", old+3*time.Hour)
	for _, id := range []string{"settled-1", "settled-2", "settled-3"} {
		b.copyOf("c", id, "old", "authoritative", old)
		b.copyOf("c", id, "new", "shadow", old-time.Minute)
	}
	b.copyOf("c", "dead-lettered", "old", "authoritative", old) // no inbox row, no shadow
	b.copyOf("c", "applied", "new", "shadow", old)              // applied from an unstamped copy
	if _, err := dbsqlc.New().InboxInsert(b.ctx, b.db.Pool, dbsqlc.InboxInsertParams{Consumer: "c", MessageID: "applied"}); err != nil {
		t.Fatal(err)
	}
	b.copyOf("c", "awaiting", "new", "shadow", old) // its authoritative copy never came
	b.copyOf("c", "recent", "old", "authoritative", time.Hour)
	b.copyOf("c", "recent", "new", "shadow", time.Hour)
	// refused: a 3h delay needs a 6h window, over the retention's 1h.
	b.copyOf("refused", "settled", "old", "authoritative", old)
	b.copyOf("refused", "settled", "new", "shadow", old)
	b.copyOf("refused", "late", "old", "authoritative", time.Hour)
	b.copyOf("refused", "late", "new", "shadow", 4*time.Hour)
	began, err := dbsqlc.New().InboxCopySince(b.ctx, b.db.Pool, dbsqlc.InboxCopySinceParams{Consumer: "c", Plan: "p"})
	if err != nil {
		t.Fatal(err)
	}

	res, m, err := b.prune(time.Hour)
	var dw *DedupeWindowError
	if !errors.As(err, &dw) || dw.Consumer != "refused" {
		t.Fatalf("prune at 1h retention: %v, want the refusal of consumer refused only", err)
	}
	want := map[string]int{"first": 2, "awaiting": 1, "recent": 2}
	if left := b.copiesLeft("c"); !maps.Equal(left, want) {
		t.Errorf("copies left of c: %v, want %v", left, want)
	}
	if left := b.copiesLeft("refused"); len(left) != 2 {
		t.Errorf("copies left of refused: %v, want both events kept", left)
	}
	var d dto.Metric
	if err := m.pruned.WithLabelValues("ferry_inbox_copy").Write(&d); err != nil {
		t.Fatal(err)
	}
	if res.CopiesDeleted != 8 || d.GetCounter().GetValue() != 8 {
		t.Errorf("%d copies reported deleted, %v counted, want 8", res.CopiesDeleted, d.GetCounter().GetValue())
	}
	after, err := dbsqlc.New().InboxCopySince(b.ctx, b.db.Pool, dbsqlc.InboxCopySinceParams{Consumer: "c", Plan: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if !after.Equal(began) {
		t.Errorf("the migration began at %s before the pass, at %s after", began, after)
	}
}
