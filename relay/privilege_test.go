package relay_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/relay"
)

// A role without the REPLICATION attribute can never stream: the relay
// stops with a fatal error that says what the role needs, instead of
// retrying "must be superuser or replication role" for ever.
func TestRoleWithoutReplicationIsFatal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	role := "norepl_" + ferrytest.Suffix()
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN PASSWORD 'norepl'`,
		`GRANT SELECT ON outbox, ferry_relay_slot TO ` + role,
	} {
		if _, err := b.db.Pool.Exec(b.ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = b.db.Pool.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = b.db.Pool.Exec(ctx, `DROP ROLE `+role)
	})
	u, err := url.Parse(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "norepl")
	cfg := b.cfg
	cfg.DatabaseURL, cfg.NoCreate = u.String(), true
	r, err := relay.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	err = r.Run(ctx)
	if !errors.Is(err, relay.ErrFatal) || !strings.Contains(err.Error(), "REPLICATION") || ctx.Err() != nil {
		t.Fatalf("Run with a role without REPLICATION: %v; want a fatal error naming REPLICATION, at once", err)
	}
}
