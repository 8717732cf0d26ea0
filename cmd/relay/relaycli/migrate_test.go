package relaycli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// `relay migrate down --database-url B` rolls back B, the database it names,
// not the one in FERRY_DATABASE_URL; without --yes it rolls back nothing and
// says which database it would have touched.
func TestMigrateDownActsOnTheNamedDatabase(t *testing.T) {
	ctx := ferrytest.Context(t, time.Minute)
	envDB, flagDB := ferrytest.NewMigratedDB(t), ferrytest.NewMigratedDB(t)
	t.Setenv("FERRY_DATABASE_URL", envDB.URL)
	latest := version(t, envDB)

	code, out, stderr := run(t, ctx, "migrate", "down", "--database-url", flagDB.URL)
	if code != 2 || !strings.Contains(stderr, "--yes") || !strings.Contains(stderr, flagDB.Name) {
		t.Errorf("migrate down without --yes: exit %d\n%s%s\nwant exit 2 naming --yes and database %s", code, out, stderr, flagDB.Name)
	}
	for _, db := range []*ferrytest.DB{envDB, flagDB} {
		if v := version(t, db); v != latest {
			t.Fatalf("after a refused migrate down: %s is at version %d, want %d", db.Name, v, latest)
		}
	}

	code, out, stderr = run(t, ctx, "migrate", "down", "--database-url", flagDB.URL, "--yes")
	if code != 0 || !strings.Contains(out, "database "+flagDB.Name) {
		t.Fatalf("migrate down --database-url B --yes: exit %d\n%s%s\nwant exit 0 naming database %s", code, out, stderr, flagDB.Name)
	}
	if v := version(t, envDB); v != latest {
		t.Errorf("migrate down --database-url %s rolled back %s, the database of FERRY_DATABASE_URL: version %d, want %d", flagDB.Name, envDB.Name, v, latest)
	}
	if v := version(t, flagDB); v != latest-1 {
		t.Errorf("migrate down --database-url %s left it at version %d, want %d", flagDB.Name, v, latest-1)
	}

	// A command that takes no argument refuses one rather than ignore what
	// follows it.
	code, _, stderr = run(t, ctx, "status", "now", "--slot", "other")
	if code != 2 || !strings.Contains(stderr, `"now"`) {
		t.Errorf("relay status now --slot other: exit %d, %q; want exit 2 naming the stray argument", code, stderr)
	}
}

func version(t *testing.T, db *ferrytest.DB) int64 {
	t.Helper()
	var v int64
	err := db.Pool.QueryRow(context.Background(),
		`SELECT max(version_id) FROM ferry_schema_version WHERE is_applied AND version_id > 0`).Scan(&v)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// `relay migrate --outbox-partitioning daily` partitions an empty outbox
// before it creates the publication and slot; a value it does not know is
// refused by name before anything runs, and an outbox holding a row is
// refused with the reason, left as it was.
func TestMigrateOutboxPartitioning(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	fresh, full := ferrytest.NewDB(t), ferrytest.NewMigratedDB(t)

	code, out, stderr := run(t, ctx, "migrate", "--database-url", fresh.URL, "--outbox-partitioning", "hourly")
	if code != 2 || !strings.Contains(stderr, "--outbox-partitioning (FERRY_OUTBOX_PARTITIONING)") || !strings.Contains(stderr, `"hourly"`) {
		t.Fatalf("migrate --outbox-partitioning hourly: exit %d\n%s%s\nwant exit 2 naming the flag and the value", code, out, stderr)
	}
	code, out, stderr = run(t, ctx, "migrate", "--database-url", fresh.URL, "--outbox-partitioning", "daily", "--slot", "ferry_"+ferrytest.Suffix())
	if code != 0 || !strings.Contains(out, "outbox is partitioned daily") {
		t.Fatalf("migrate --outbox-partitioning daily: exit %d\n%s%s", code, out, stderr)
	}
	var kind string
	var viaRoot bool
	if err := fresh.Pool.QueryRow(ctx, `SELECT (SELECT relkind::text FROM pg_class WHERE oid = 'outbox'::regclass),
		(SELECT pubviaroot FROM pg_publication WHERE pubname = 'ferry')`).Scan(&kind, &viaRoot); err != nil {
		t.Fatal(err)
	}
	if kind != "p" || !viaRoot {
		t.Fatalf("after migrate --outbox-partitioning daily: outbox relkind %q, publication via root %v; want p and true", kind, viaRoot)
	}

	if _, err := full.Pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		VALUES (gen_random_uuid(), 'order', '1', 'Placed', '')`); err != nil {
		t.Fatal(err)
	}
	code, out, stderr = run(t, ctx, "migrate", "--database-url", full.URL, "--outbox-partitioning", "daily", "--no-slot")
	if code != 1 || !strings.Contains(stderr, "outbox holds rows") {
		t.Fatalf("migrate --outbox-partitioning daily of an outbox with a row: exit %d\n%s%s\nwant exit 1 saying the outbox holds rows", code, out, stderr)
	}
	if err := full.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'outbox'::regclass`).Scan(&kind); err != nil || kind != "r" {
		t.Fatalf("after the refusal the outbox's relkind is %q (%v), want r", kind, err)
	}
}
