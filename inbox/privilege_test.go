package inbox

import (
	"context"
	"net/url"
	"testing"

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
			role := "ferry_worker_" + ferrytest.Suffix()
			for _, stmt := range []string{
				`CREATE ROLE ` + role + ` LOGIN PASSWORD 'worker'`,
				`GRANT SELECT, INSERT ON inbox TO ` + role,
				`GRANT INSERT ON inbox_parked TO ` + role,
				`GRANT SELECT, INSERT ON ferry_inbox_channel TO ` + role,
				`GRANT SELECT, INSERT, UPDATE ON ferry_inbox_fence TO ` + role,
				`GRANT SELECT, INSERT ON ferry_inbox_copy TO ` + role,
				`GRANT SELECT, INSERT, DELETE ON ferry_inbox_quarantine TO ` + role,
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
