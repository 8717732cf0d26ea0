package schema_test

import (
	"context"
	"database/sql"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/schema"
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
	m, err := schema.New(b.db, schema.Ferry, nil)
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
	if err := schema.Up(b.ctx, b.db); err != nil {
		t.Fatal(err)
	}
	if !tableExists(t, b, schema.FerryVersionTable) {
		t.Fatalf("version table %s missing", schema.FerryVersionTable)
	}
	if tableExists(t, b, "goose_db_version") {
		t.Fatal("Ferry's migrations wrote goose's default table goose_db_version")
	}
}

// An application's own goose set keeps its own history beside Ferry's.
func TestSetsCoexist(t *testing.T) {
	t.Parallel()
	b := setup(t)
	app := schema.Set{
		VersionTable: "goose_db_version",
		FS: fstest.MapFS{
			"00001_orders.sql": {Data: []byte("-- +goose Up\nCREATE TABLE orders (id int PRIMARY KEY);\n-- +goose Down\nDROP TABLE orders;\n")},
		},
	}
	am, err := schema.New(b.db, app, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := am.Up(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := schema.Up(b.ctx, b.db); err != nil {
		t.Fatal(err)
	}
	for _, tbl := range append([]string{"orders", "goose_db_version", schema.FerryVersionTable}, ferryTables...) {
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
	if _, err := schema.New(db, schema.Set{FS: schema.Ferry.FS}, nil); err == nil {
		t.Fatal("New accepted a set without VersionTable")
	}
	if _, err := schema.New(nil, schema.Ferry, nil); err == nil {
		t.Fatal("New accepted a nil db")
	}
}

// Migration 00012 turns each slot's recorded step (route_seq, route_lsn)
// into its step history: the step from route_lsn on and, before it, the
// one before it (what a relay took as in effect there); and its Down turns
// the newest step of the history back into route_seq and route_lsn.
func TestRelaySlotStepsKeepTheRecordedStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m, err := schema.New(b.db, schema.Ferry, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(b.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.DownTo(b.ctx, 11); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`INSERT INTO ferry_migration (name, old_channel, new_channel, groups, created_by) VALUES ('p', '{}', '{}', '{g}', 'test')`,
		`INSERT INTO ferry_migration_step (migration, epoch, phase, slices, seq) VALUES
			('p', 0, 'OLD_ONLY', 0, 10), ('p', 1, 'DUAL_WRITE', 0, 20), ('p', 2, 'CUTOVER', 64, 30)`,
		`INSERT INTO ferry_relay_slot (slot_name, system_identifier, created_lsn, confirmed_lsn, route_seq, route_lsn) VALUES
			('applied', '1', '0/1', '0/1', 30, '0/300'),
			('from_start', '1', '0/1', '0/1', 20, NULL),
			('unknown', '1', '0/1', '0/1', NULL, NULL),
			('first', '1', '0/1', '0/1', 10, '0/100')`,
	} {
		if _, err := b.db.ExecContext(b.ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if _, err := m.Up(b.ctx); err != nil {
		t.Fatal(err)
	}
	var history string
	if err := b.db.QueryRowContext(b.ctx, `SELECT string_agg(s.slot_name || ':' || coalesce(e.key || '@' || e.value, '-'), ' '
		ORDER BY s.slot_name, e.key::bigint) FROM ferry_relay_slot s LEFT JOIN jsonb_each_text(s.route_steps) e ON true`).Scan(&history); err != nil {
		t.Fatal(err)
	}
	if want := "applied:20@0/0 applied:30@0/300 first:0@0/0 first:10@0/100 from_start:20@0/0 unknown:-"; history != want {
		t.Fatalf("step history after 00012\n got %s\nwant %s", history, want)
	}

	if _, err := m.DownTo(b.ctx, 11); err != nil {
		t.Fatal(err)
	}
	var route string
	if err := b.db.QueryRowContext(b.ctx, `SELECT string_agg(slot_name || ':' || coalesce(route_seq::text, '-') || '@' || coalesce(route_lsn::text, '-'), ' '
		ORDER BY slot_name) FROM ferry_relay_slot`).Scan(&route); err != nil {
		t.Fatal(err)
	}
	if want := "applied:30@0/300 first:10@0/100 from_start:20@- unknown:-@-"; route != want {
		t.Fatalf("route_seq and route_lsn after 00012 down\n got %s\nwant %s", route, want)
	}
}
