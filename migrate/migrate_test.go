package migrate_test

import (
	"context"
	"database/sql"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/migrate"
)

type bundle struct {
	ctx context.Context
	db  *sql.DB
}

func setup(t *testing.T) bundle {
	t.Helper()
	d := ferrytest.NewDB(t)
	return bundle{ctx: ferrytest.Context(t, time.Minute), db: d.SQL(t)}
}

func tableExists(t *testing.T, b bundle, name string) bool {
	t.Helper()
	var ok bool
	if err := b.db.QueryRowContext(b.ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
		t.Fatalf("to_regclass(%s): %v", name, err)
	}
	return ok
}

var ferryTables = []string{"outbox", "inbox", "outbox_quarantine", "ferry_relay_slot"}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m, err := migrate.New(b.db, migrate.Ferry, nil)
	if err != nil {
		t.Fatal(err)
	}
	check := func(step string, want bool) {
		t.Helper()
		for _, tbl := range ferryTables {
			if got := tableExists(t, b, tbl); got != want {
				t.Fatalf("%s: table %s exists = %v, want %v", step, tbl, got, want)
			}
		}
	}

	res, err := m.Up(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) == 0 || res[0].Direction != "up" {
		t.Fatalf("first Up applied %+v, want at least one up migration", res)
	}
	check("after up", true)
	cur, latest, err := m.Version(b.ctx)
	if err != nil || cur != latest || cur == 0 {
		t.Fatalf("Version after up = %d, %d, %v; want current = latest > 0", cur, latest, err)
	}

	if _, err := m.DownTo(b.ctx, 0); err != nil {
		t.Fatal(err)
	}
	check("after down", false)

	if _, err := m.Up(b.ctx); err != nil {
		t.Fatal(err)
	}
	check("after second up", true)

	// A second Up is a no-op.
	res, err = m.Up(b.ctx)
	if err != nil || len(res) != 0 {
		t.Fatalf("repeated Up applied %+v, %v; want nothing", res, err)
	}
}

func TestVersionTableHasFerrysName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := migrate.Up(b.ctx, b.db); err != nil {
		t.Fatal(err)
	}
	if !tableExists(t, b, migrate.FerryVersionTable) {
		t.Fatalf("version table %s missing", migrate.FerryVersionTable)
	}
	if tableExists(t, b, "goose_db_version") {
		t.Fatal("Ferry's migrations wrote goose's default table goose_db_version")
	}
}

// An application's own goose set keeps its own history beside Ferry's.
func TestSetsCoexist(t *testing.T) {
	t.Parallel()
	b := setup(t)
	app := migrate.Set{
		VersionTable: "goose_db_version",
		FS: fstest.MapFS{
			"00001_orders.sql": {Data: []byte("-- +goose Up\nCREATE TABLE orders (id int PRIMARY KEY);\n-- +goose Down\nDROP TABLE orders;\n")},
		},
	}
	am, err := migrate.New(b.db, app, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := am.Up(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := migrate.Up(b.ctx, b.db); err != nil {
		t.Fatal(err)
	}
	for _, tbl := range append([]string{"orders", "goose_db_version", migrate.FerryVersionTable}, ferryTables...) {
		if !tableExists(t, b, tbl) {
			t.Fatalf("table %s missing", tbl)
		}
	}
	// Rolling the application back leaves Ferry's tables alone.
	if _, err := am.DownTo(b.ctx, 0); err != nil {
		t.Fatal(err)
	}
	if tableExists(t, b, "orders") || !tableExists(t, b, "outbox") {
		t.Fatal("rolling back the application's set touched the wrong tables")
	}
}

func TestNewRejectsIncompleteSet(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgx", "postgres://unused")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := migrate.New(db, migrate.Set{FS: migrate.Ferry.FS}, nil); err == nil {
		t.Fatal("New accepted a set without VersionTable")
	}
	if _, err := migrate.New(nil, migrate.Ferry, nil); err == nil {
		t.Fatal("New accepted a nil db")
	}
}
