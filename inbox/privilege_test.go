package inbox

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// A worker runs as a role with only the grants docs/security.md
// lists (SELECT and INSERT on inbox, INSERT on inbox_parked) plus its
// handler's: one message per transaction and in batches.
func TestLeastPrivilegeRoleApplies(t *testing.T) {
	t.Parallel()
	for _, mode := range modes[:2] {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			pool := leastPrivilegePool(t, b)
			for i, id := range []string{"m-1", "m-2", "m-1"} {
				b.produce(b.record(id, "k", 0, i+1))
			}
			cfg := b.config()
			cfg.DB = pool
			mode.set(cfg)
			b.start(b.newWorker(cfg, effectHandler))
			b.waitCommitted(b.consumer, 0, 3)
			for _, id := range []string{"m-1", "m-2"} {
				if n := b.effects(id); n != 1 {
					t.Errorf("%s has %d effects, want 1", id, n)
				}
			}
		})
	}
}

// leastPrivilegePool connects to b's database as a new role with only the
// grants docs/security.md lists for a worker, plus its handler's.
func leastPrivilegePool(t *testing.T, b *bundle) *pgxpool.Pool {
	t.Helper()
	role := "ferry_worker_" + ferrytest.Suffix()
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN PASSWORD 'worker'`,
		`GRANT SELECT, INSERT ON inbox TO ` + role,
		`GRANT INSERT ON inbox_parked TO ` + role,
		`GRANT SELECT, INSERT ON ferry_inbox_channel TO ` + role,
		`GRANT SELECT, INSERT, UPDATE ON ferry_inbox_fence TO ` + role,
		`GRANT SELECT, INSERT, UPDATE ON ferry_inbox_copy TO ` + role,
		`GRANT SELECT, INSERT, DELETE ON ferry_inbox_quarantine TO ` + role,
		`GRANT SELECT, INSERT, UPDATE ON ferry_inbox_shadow_scan TO ` + role,
		`GRANT INSERT ON effects TO ` + role, // the handler's own
		`GRANT USAGE ON SEQUENCE effects_n_seq TO ` + role,
	} {
		if _, err := b.db.Pool.Exec(b.ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		_, _ = b.db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = b.db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	u, err := url.Parse(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "worker")
	pool, err := pgxpool.New(b.ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// A live migration's quarantine pass runs as the least-privileged role:
// it locates a shadow whose authoritative copy is late, and forgets where
// once the event is applied (an UPDATE of ferry_inbox_copy each). Before,
// docs/security.md granted SELECT and INSERT only on ferry_inbox_copy, and
// every pass with a shadow to locate failed on "permission denied", logged
// at WARN: the quarantine never held an event. It also records where the
// next pass resumes (ferry_inbox_shadow_scan), which a restarted worker
// reads back.
func TestLeastPrivilegeRoleRunsTheQuarantinePass(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.learnedMove()
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest,
		received_at, topic, partition, record_offset, record_key)
		VALUES ($1, 'm-late', 'move', 'new', 'shadow', 1, '\x01', now() - interval '1 hour', 'new.order', 0, 0, '\x6b')`,
		b.consumer); err != nil {
		t.Fatal(err)
	}
	cfg := b.config()
	cfg.DB = leastPrivilegePool(t, b)
	w := b.newWorker(cfg, effectHandler)
	scan := func() int {
		t.Helper()
		var awaited int
		var next shadowScan
		if err := pgx.BeginFunc(b.ctx, cfg.DB, func(tx pgx.Tx) error {
			rows, scan, err := w.quarantineScan(b.ctx, tx, b.consumer)
			awaited, next = len(rows), scan
			return err
		}); err != nil {
			t.Fatalf("a quarantine pass as the least-privileged role: %v", err)
		}
		w.shadowScans[b.consumer] = w.saveShadowScan(b.ctx, b.consumer, next)
		return awaited
	}
	if n := scan(); n != 1 {
		t.Fatalf("the pass awaits %d partitions, want m-late's", n)
	}
	// Where the next pass resumes, recorded and read back as that role.
	if s := b.newWorker(cfg, effectHandler).loadShadowScan(b.ctx, b.consumer); !s.since.xmax.Valid {
		t.Fatalf("a restarted worker found no record of where the last pass left off: %+v", s)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO inbox (consumer, message_id) VALUES ($1, 'm-late')`, b.consumer); err != nil {
		t.Fatal(err)
	}
	if n := scan(); n != 0 {
		t.Fatalf("the pass awaits %d partitions once m-late is applied, want none", n)
	}
}
