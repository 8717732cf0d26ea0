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
