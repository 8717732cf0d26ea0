package deploytest_test

import (
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// The roles of deploy/sql/ferry-roles.sql are enough: the relay, with
// --no-create as ferry_relay, publishes an event, and a worker as
// reserva_worker applies it (with a handler that touches no table of its
// own).
func TestLeastPrivilegeRolesRun(t *testing.T) {
	t.Parallel()
	ctx := ferrytest.Context(t, 2*time.Minute)
	db := ferrytest.NewMigratedDB(t)
	suffix := ferrytest.Suffix()
	slot := "roles_" + suffix
	var logs ferrytest.Buffer
	if code := relaycli.Main(ctx, []string{"migrate", "--database-url", db.URL, "--slot", slot}, io.Discard, &logs); code != 0 {
		t.Fatalf("relay migrate: exit %d\n%s", code, logs.String())
	}

	// Roles belong to the cluster: each test run gets its own names.
	sql := string(readDeploy(t, "sql/ferry-roles.sql"))
	roles := map[string]string{"ferry_relay": "ferry_relay_" + suffix, "reserva_worker": "reserva_worker_" + suffix}
	for role, unique := range roles {
		re := regexp.MustCompile(`\b` + role + `\b`)
		if !re.MatchString(sql) {
			t.Fatalf("deploy/sql/ferry-roles.sql creates no role %s", role)
		}
		sql = re.ReplaceAllString(sql, unique)
		t.Cleanup(func() {
			_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+unique)
			_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+unique)
		})
	}
	if _, err := db.Pool.Exec(ctx, sql); err != nil {
		t.Fatalf("deploy/sql/ferry-roles.sql: %v", err)
	}
	as := func(role string) string {
		url := strings.Replace(db.URL, "ferry:ferry@", roles[role]+"@", 1)
		if url == db.URL {
			t.Fatalf("test URL %s has no user to replace", db.URL)
		}
		return url
	}

	agg := "roles" + suffix
	topic := "outbox.event." + agg
	ferrytest.CreateTopic(t, topic, 1)
	brokers := strings.Join(ferrytest.Brokers(t), ",")
	relayAddr, workerAddr := freeAddr(t), freeAddr(t)
	relayExited := serve(t, ctx, "relay", &logs, func(ctx context.Context) int {
		return relaycli.Main(ctx, []string{"run", "--no-create", "--database-url", as("ferry_relay"), "--kafka-brokers", brokers,
			"--slot", slot, "--http-addr", relayAddr, "--log-format", "json"}, io.Discard, &logs)
	})
	waitReady(t, ctx, relayAddr, relayExited, &logs)
	applied := make(chan string, 1)
	register := func(w *inbox.Worker) error {
		w.Handle("roles", topic, func(_ context.Context, _ pgx.Tx, m *inbox.Message) error {
			applied <- m.ID
			return nil
		})
		return nil
	}
	workerExited := serve(t, ctx, "worker", &logs, func(ctx context.Context) int {
		return workercli.Main(ctx, []string{"run", "--database-url", as("reserva_worker"), "--kafka-brokers", brokers,
			"--http-addr", workerAddr, "--log-format", "json"}, io.Discard, &logs, &workercli.App{Register: register})
	})
	waitReady(t, ctx, workerAddr, workerExited, &logs)

	ids, err := outbox.Write(ctx, db.Pool, outbox.Event{AggregateType: agg, AggregateID: "1", EventType: "Placed"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-applied:
		if id != ids[0].String() {
			t.Fatalf("applied %s, want %s", id, ids[0])
		}
	case <-ctx.Done():
		t.Fatalf("the event was never applied:\n%s", logs.String())
	}
	// The handler ran; its transaction, with the inbox row, commits next.
	for {
		var rows int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE consumer = 'roles'`).Scan(&rows)
		if err == nil && rows == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("inbox rows of consumer roles: %d, %v; want 1\n%s", rows, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Retention as reserva_worker, with the copies a live migration left
	// 8 days ago: the plan's first event is kept, the second deleted.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest, received_at)
		SELECT 'roles', m, 'move', s, CASE s WHEN 'old' THEN 'authoritative' ELSE 'shadow' END, 1, '\x01', now() - interval '8 days' + n * interval '1 second'
		FROM unnest(ARRAY['first', 'second']) WITH ORDINALITY AS e(m, n), unnest(ARRAY['old', 'new']) AS s`); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if code := workercli.Main(ctx, []string{"prune", "--database-url", as("reserva_worker")}, &out, &logs, &workercli.App{Register: register}); code != 0 ||
		!strings.Contains(out.String(), "deleted 2 copies") {
		t.Fatalf("worker prune as reserva_worker: exit %d, printed %q, want 2 copies deleted\n%s", code, out.String(), logs.String())
	}
}
