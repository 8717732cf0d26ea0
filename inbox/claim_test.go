package inbox

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// In a partitioned inbox, whose primary key holds the day, a message is
// still applied once per consumer: a copy arriving today of a message
// applied yesterday (another partition) is a duplicate, and copies
// consumed at once from several Kafka partitions take effect once, one
// message per transaction, in batches and per key alike.
func TestPartitionedInboxAppliesOnceAcrossPartitions(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setupDB(t, 4, ferrytest.NewPartitionedDB(t))
			yesterday := time.Now().Add(-24 * time.Hour)
			ferrytest.DayPartition(t, b.db, "inbox", yesterday)
			if _, err := dbsqlc.New().InboxClaimMany(b.ctx, b.db.Pool, dbsqlc.InboxClaimManyParams{
				Consumer: b.consumer, MessageIds: []string{"m-old"}, Now: &yesterday}); err != nil {
				t.Fatal(err)
			}
			for p := range int32(4) {
				b.produce(b.record("m-old", "k-old", p, 1), b.record("m-1", "k1", p, 1), b.record("m-1", "k1", p, 1))
			}
			b.produce(b.record("m-2", "k2", 0, 2))
			cfg := b.config()
			cfg.Concurrency = 4
			mode.set(cfg)
			b.start(b.newWorker(cfg, effectHandler))
			for p := range int32(4) {
				b.waitCommitted(b.consumer, p, map[bool]int64{true: 4, false: 3}[p == 0])
			}
			for id, want := range map[string]int{"m-old": 0, "m-1": 1, "m-2": 1} {
				if n := b.effects(id); n != want {
					t.Errorf("%s has %d effects, want %d", id, n, want)
				}
			}
			if n := b.count(`SELECT count(*) FROM inbox WHERE consumer = $1 AND tableoid = $2::regclass`,
				b.consumer, "inbox_p"+yesterday.UTC().Format("20060102")); n != 1 {
				t.Errorf("%d inbox rows in yesterday's partition, want m-old's alone", n)
			}
		})
	}
}

// A claim in a partitioned inbox waits for an open claim of the same
// message, and then finds it if it committed, or claims it if it rolled
// back; a claim outside READ COMMITTED, which could not see the first, is
// refused.
func TestPartitionedClaimWaitsForAnOpenClaim(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewPartitionedDB(t)
	q := dbsqlc.New()
	claimIn := func(tx pgx.Tx, id string) <-chan []string {
		out := make(chan []string, 1)
		go func() {
			got, err := claimPartitioned(ctx, q, tx, "c", []string{id, id})
			if err != nil {
				t.Error(err)
			}
			out <- got
		}()
		return out
	}
	for _, end := range []string{"commit", "rollback"} {
		id := "m-" + end
		first, second := begin(t, db), begin(t, db)
		if got := <-claimIn(first, id); len(got) != 1 {
			t.Fatalf("first claim of %s: %v, want it claimed once", id, got)
		}
		waiting := claimIn(second, id)
		select {
		case got := <-waiting:
			t.Fatalf("a second claim of %s returned %v while the first was open, want it to wait", id, got)
		case <-time.After(300 * time.Millisecond):
		}
		var err error
		if end == "commit" {
			err = first.Commit(ctx)
		} else {
			err = first.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		got := <-waiting
		if want := map[string]int{"commit": 0, "rollback": 1}[end]; len(got) != want {
			t.Fatalf("second claim of %s after the first's %s: %v, want %d claimed", id, end, got, want)
		}
		if err := second.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d inbox rows (%v), want one per message", n, err)
	}

	rr, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rr.Rollback(ctx) }()
	if _, err := claimPartitioned(ctx, q, rr, "c", []string{"m-rr"}); !errors.Is(err, ErrIsolation) {
		t.Fatalf("claim in a REPEATABLE READ transaction: %v, want ErrIsolation", err)
	}
}

func begin(t *testing.T, db *ferrytest.DB) pgx.Tx {
	t.Helper()
	tx, err := db.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(t.Context()) })
	return tx
}

// Retention of a partitioned inbox drops the days wholly older than the
// window, never a younger one nor the default partition, and widens the
// window to the dedupe window of a consumer whose live migration needs
// more: the partitions are shared.
func TestPartitionedPruneDropsExpiredDays(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewPartitionedDB(t)
	now := time.Now()
	old := ferrytest.DayPartition(t, db, "inbox", now.AddDate(0, 0, -10))
	recent := ferrytest.DayPartition(t, db, "inbox", now.AddDate(0, 0, -3))
	q := dbsqlc.New()
	for _, at := range []time.Time{now.AddDate(0, 0, -10), now.AddDate(0, 0, -3), now.AddDate(0, 0, -40)} {
		if _, err := q.InboxClaimMany(ctx, db.Pool, dbsqlc.InboxClaimManyParams{Consumer: "c", MessageIds: []string{at.String()}, Now: &at}); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(name string) bool {
		var ok bool
		if err := db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	// A live migration whose copies arrived 5 days apart: a window of 10
	// days for consumer m, more than the 5 days of retention.
	for side, ago := range map[string]time.Duration{"old": 6 * 24 * time.Hour, "new": 24 * time.Hour} {
		if err := q.InboxCopyInsert(ctx, db.Pool, dbsqlc.InboxCopyInsertParams{Consumer: "m", MessageID: "x", Plan: "p",
			Side: side, Role: "authoritative", Epoch: 1, Digest: []byte{1}, ReceivedAt: now.Add(-ago)}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := &PruneConfig{InboxRetention: 5 * 24 * time.Hour}
	res, err := Prune(ctx, db.Pool, cfg)
	if err != nil || !res.Partitioned || res.PartitionsDropped != 0 || res.Retention != 10*24*time.Hour || !res.DefaultHasRows {
		t.Fatalf("Prune under a 10-day dedupe window: %+v, %v; want nothing dropped, the 10-day window applied and the default's row seen", res, err)
	}
	if _, err := db.Pool.Exec(ctx, `DELETE FROM ferry_inbox_copy`); err != nil {
		t.Fatal(err)
	}
	res, err = Prune(ctx, db.Pool, cfg)
	if err != nil || res.PartitionsDropped != 1 || exists(old) || !exists(recent) || !exists("inbox_default") {
		t.Fatalf("Prune: %+v, %v; %s exists %v, %s exists %v; want only the 10-day-old partition dropped",
			res, err, old, exists(old), recent, exists(recent))
	}
}
