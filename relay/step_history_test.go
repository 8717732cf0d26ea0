package relay

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// The step in effect at a position is the newest recorded at or before
// it, however many recorded steps lie past it.
func TestStepAt(t *testing.T) {
	t.Parallel()
	h := []appliedStep{{seq: 3, at: 0}, {seq: 5, at: 100}, {seq: 8, at: 200}, {seq: 9, at: 300}}
	for _, tc := range []struct {
		pos  pglogrepl.LSN
		want int64
	}{
		{0, 3}, {99, 3}, {100, 5}, {199, 5}, {200, 8}, {299, 8}, {300, 9}, {1 << 40, 9},
	} {
		if got, ok := stepAt(h, tc.pos); !ok || got != tc.want {
			t.Errorf("stepAt(%s) = %d, %v; want %d", tc.pos, got, ok, tc.want)
		}
	}
	// Pruned to what restart_lsn needs: a position before the oldest has
	// no step in effect (the relay stops rather than guess).
	if got, ok := stepAt(h[2:], 150); ok {
		t.Errorf("stepAt(150) of %v = %d, want none", h[2:], got)
	}
	if _, ok := stepAt(nil, 150); ok {
		t.Error("stepAt of no history found a step")
	}
}

// A slot recorded again (created again by `relay recover`) starts its step
// history over: the step in effect from its start alone, or nothing when
// the step is unknown (a slot an administrator made).
func TestRecordSlotStartsTheStepHistoryOver(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	history := func() []string {
		t.Helper()
		rows, err := db.Pool.Query(ctx, `SELECT e.key || '@' || e.value FROM ferry_relay_slot s, jsonb_each_text(s.route_steps) e
			WHERE s.slot_name = 's' ORDER BY e.key::bigint`)
		if err != nil {
			t.Fatal(err)
		}
		h, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	check := func(what string, want ...string) {
		t.Helper()
		if got := history(); !slices.Equal(got, want) {
			t.Fatalf("%s: history %v, want %v", what, got, want)
		}
	}

	if err := recordSlot(ctx, db.Pool, "s", "0/100", pgtype.Int8{Int64: 5, Valid: true}, true); err != nil {
		t.Fatal(err)
	}
	check("created", "5@0/0")
	for seq, at := range map[int64]pglogrepl.LSN{7: 0x200, 9: 0x300} {
		if err := recordStep(ctx, db.Pool, "s", seq, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := recordStep(ctx, db.Pool, "s", 7, 0x200); err != nil { // applied again after a restart
		t.Fatal(err)
	}
	check("two steps applied, one twice", "5@0/0", "7@0/200", "9@0/300")

	if err := recordSlot(ctx, db.Pool, "s", "0/400", pgtype.Int8{Int64: 9, Valid: true}, true); err != nil {
		t.Fatal(err)
	}
	check("created again after step 9", "9@0/0")
	if err := recordSlot(ctx, db.Pool, "s", "0/500", pgtype.Int8{}, false); err != nil {
		t.Fatal(err)
	}
	check("found without a record")
}

// The position a session routes from is read while its own walsender holds
// the slot, and never while another process or none does: only then is it
// where the server started the stream.
func TestStartPositionIsReadWhileTheSessionHoldsTheSlot(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, time.Minute)
	db := ferrytest.NewMigratedDB(t)
	slot := "ferry_" + ferrytest.Suffix()
	if err := prepare(ctx, db.Pool, slot, "ferry", false, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	var confirmed string
	if err := db.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if _, err := startPosition(ctx, db.Pool, slot, 1); err == nil || !strings.Contains(err.Error(), "held by process 0") {
		t.Fatalf("start position of a slot no process holds: %v, want an error naming no holder", err)
	}

	cfg, err := pgconn.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'ferry'"},
	}); err != nil {
		t.Fatal(err)
	}
	start, err := startPosition(ctx, db.Pool, slot, conn.PID())
	if err != nil || start.String() != confirmed {
		t.Fatalf("start position while the session holds the slot: %s, %v; want %s", start, err, confirmed)
	}
	if _, err := startPosition(ctx, db.Pool, slot, conn.PID()+1); err == nil {
		t.Fatal("start position read for a session whose walsender does not hold the slot")
	}
}
