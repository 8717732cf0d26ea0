package inbox

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// Two shadow writers record batches that share copies (a shadow brought
// again, after a revoke, while its first delivery still waits in the
// queue) without waiting on each other in a cycle: each transaction takes
// the copies' keys in one order, so neither is chosen as a deadlock's
// victim and retried, and every copy is recorded once.
func TestShadowWritersSharingCopiesNeverDeadlock(t *testing.T) {
	t.Parallel()
	db := ferrytest.NewMigratedDB(t)
	ctx := ferrytest.Context(t, 2*time.Minute)
	var logs ferrytest.Buffer
	s := testShadowWriter(db, &logs)
	const n = shadowBatch
	for round := range 10 {
		var batch []shadowItem
		for i := range n {
			batch = append(batch, testShadow(fmt.Sprintf("r%d-m%04d", round, i), i, time.Now()))
		}
		reversed := slices.Clone(batch)
		slices.Reverse(reversed)
		var wg sync.WaitGroup
		for _, b := range [][]shadowItem{batch, reversed} {
			wg.Go(func() {
				if !s.write(ctx, b) {
					t.Error("a shadow writer stopped before its batch was recorded")
				}
			})
		}
		wg.Wait()
	}
	var recorded int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ferry_inbox_copy WHERE consumer = 'c' AND role = 'shadow'`).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if recorded != 10*n {
		t.Fatalf("%d shadow copies recorded, want %d", recorded, 10*n)
	}
	if logs.String() != "" {
		t.Fatalf("a shadow writer had to retry:\n%s", logs.String())
	}
}

// A batch whose copies are partly recorded already (brought again after a
// revoke or a crash), one of them twice in the batch, records the others,
// each once, keeps what was recorded first, and logs nothing: a writer
// takes a batch for new first, and a copy already there sends it the way
// that skips recorded copies, not into the retry loop.
func TestShadowWriterRecordsABatchHoldingRecordedCopiesOnce(t *testing.T) {
	t.Parallel()
	db := ferrytest.NewMigratedDB(t)
	ctx := ferrytest.Context(t, time.Minute)
	var logs ferrytest.Buffer
	s := testShadowWriter(db, &logs)
	first := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	item := func(i int, at time.Time) shadowItem { return testShadow(fmt.Sprintf("m%03d", i), i, at) }
	var before []shadowItem
	for i := 0; i < 100; i += 10 {
		before = append(before, item(i, first))
	}
	if !s.write(ctx, before) {
		t.Fatal("the first batch was not recorded")
	}
	var batch []shadowItem
	for i := range 100 {
		batch = append(batch, item(i, time.Now()))
	}
	batch = append(batch, item(55, time.Now()))
	if !s.write(ctx, batch) {
		t.Fatal("the batch holding recorded copies was not recorded")
	}
	var recorded, kept int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE received_at = $1)
		FROM ferry_inbox_copy WHERE consumer = 'c' AND role = 'shadow'`, first).Scan(&recorded, &kept); err != nil {
		t.Fatal(err)
	}
	if recorded != 100 || kept != len(before) {
		t.Fatalf("%d shadow copies recorded (want 100), %d of them as first recorded (want %d)", recorded, kept, len(before))
	}
	if logs.String() != "" {
		t.Fatalf("the shadow writer had to retry:\n%s", logs.String())
	}
}

// testShadowWriter is a shadow writer on db whose worker logs to logs and
// retries within milliseconds.
func testShadowWriter(db *ferrytest.DB, logs *ferrytest.Buffer) *shadowWriter {
	w := &Worker{queries: dbsqlc.New()}
	w.cfg.DB = db.Pool
	w.cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	w.cfg.RetryBackoff, w.cfg.RetryBackoffMax = time.Millisecond, 10*time.Millisecond
	return newShadowWriter(w)
}

// testShadow is consumer c's shadow copy of id on the new side of plan
// "move", at offset off of topic t, received at at.
func testShadow(id string, off int, at time.Time) shadowItem {
	return shadowItem{row: dbsqlc.InboxCopyInsertParams{Consumer: "c", MessageID: id,
		Plan: "move", Side: "new", Role: "shadow", Epoch: 1, Digest: []byte{1}, ReceivedAt: at,
		Topic: pgtype.Text{String: "t", Valid: true}, Partition: pgtype.Int4{Valid: true}, RecordOffset: pgtype.Int8{Int64: int64(off), Valid: true},
		RecordValue: []byte("v"), RecordHeaders: []byte("[]")}}
}
