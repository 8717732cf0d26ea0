package relay_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// An idle outbox does not pin WAL while another table takes 50,000 writes:
// with nothing in flight the relay confirms the server's WAL end.
func TestIdleOutboxDoesNotPinWAL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.topic(t, "order", 1)
	b.cfg.StatusInterval = 200 * time.Millisecond
	b.start(t, b.cfg)

	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE busy (id bigserial PRIMARY KEY, body text)`); err != nil {
		t.Fatal(err)
	}
	var start string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO busy (body) SELECT repeat('x', 200) FROM generate_series(1, 1000)`); err != nil {
			t.Fatal(err)
		}
	}
	var written int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, start).Scan(&written); err != nil {
		t.Fatal(err)
	}

	// The slot's confirmed position follows the server: what it lags behind
	// stays a small fraction of what was written.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var lag int64
		err := b.db.Pool.QueryRow(b.ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&lag)
		if err != nil {
			t.Fatal(err)
		}
		if lag < written/10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot still %d bytes behind after the other table wrote %d bytes of WAL", lag, written)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A checkpoint logs the running transactions, which lets the slot's
	// restart_lsn follow, so the retained WAL shrinks too.
	deadline = time.Now().Add(30 * time.Second)
	for {
		if _, err := b.db.Pool.Exec(b.ctx, `CHECKPOINT`); err != nil {
			t.Fatal(err)
		}
		st, err := relay.Status(b.ctx, b.db.Pool, b.slot)
		if err != nil {
			t.Fatal(err)
		}
		if st.RetainedWALBytes < written/10 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot retains %d bytes of WAL after %d bytes were written to another table", st.RetainedWALBytes, written)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ALTER TABLE outbox ADD COLUMN while events stream: the relay reads columns
// by name from the new Relation message and loses nothing.
func TestAddColumnUnderLoadLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 2)
	b.start(t, b.cfg)

	var mu sync.Mutex
	var ids []string
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			got := b.write(t, evt("order", "o"+string(rune('a'+i%5)), i), evt("order", "p", i))
			mu.Lock()
			ids = append(ids, got...)
			mu.Unlock()
		}
	}()
	time.Sleep(300 * time.Millisecond)
	// The DDL makes PostgreSQL send a new Relation message mid-stream.
	if _, err := b.db.Pool.Exec(b.ctx, `ALTER TABLE outbox ADD COLUMN tenant text NOT NULL DEFAULT 'acme'`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := b.db.Pool.Exec(b.ctx, `ALTER TABLE outbox DROP COLUMN tenant`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if len(ids) < 20 {
		t.Fatalf("only %d events written around the DDL", len(ids))
	}
	consume(t, []string{topic}, ids, time.Minute, 0)
}

// The relay reads outbox columns by name: a table whose columns sit in
// another order, with one of its own in between, publishes the same records.
func TestColumnsAreReadByName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	_, err := b.db.Pool.Exec(b.ctx, `
		DROP TABLE outbox;
		CREATE TABLE outbox (
			created_at timestamptz NOT NULL DEFAULT now(),
			tenant text NOT NULL DEFAULT 'acme',
			payload bytea NOT NULL,
			headers jsonb NOT NULL DEFAULT '{}',
			event_type text NOT NULL,
			aggregate_id text NOT NULL,
			id uuid PRIMARY KEY,
			aggregate_type text NOT NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	b.start(t, b.cfg)
	ev := evt("order", "o-1", 7)
	ids := b.write(t, ev)
	c := consume(t, []string{topic}, ids, time.Minute, 0)
	rec := c.records[0]
	if string(rec.Key) != "o-1" || string(rec.Value) != string(ev.Payload) || header(rec, "seq") != "7" ||
		header(rec, outbox.HeaderEventType) != ev.EventType || header(rec, outbox.HeaderAggregateType) != "order" {
		t.Fatalf("record %q=%q headers %v, want the event as written", rec.Key, rec.Value, rec.Headers)
	}
}

// With NoCreate, a missing publication is a fatal error that names it and
// says how to create it.
func TestNoCreateReportsMissingPublication(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.cfg.NoCreate = true
	r, err := relay.New(&b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(b.ctx)
	if err == nil || !strings.Contains(err.Error(), `"ferry"`) || !strings.Contains(err.Error(), "CREATE PUBLICATION") {
		t.Fatalf("Run = %v, want an error naming publication \"ferry\" with the statement to create it", err)
	}
	if !isFatal(err, relay.ErrPublicationMissing) {
		t.Fatalf("Run = %v, want ErrPublicationMissing", err)
	}

	// Created by an administrator without the migration steps: the
	// statement that adds them is named.
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE PUBLICATION ferry FOR TABLE outbox WITH (publish = 'insert')`); err != nil {
		t.Fatal(err)
	}
	err = r.Run(b.ctx)
	if !isFatal(err, relay.ErrPublicationMissing) || !strings.Contains(err.Error(), `ALTER PUBLICATION "ferry" ADD TABLE ferry_migration_step`) {
		t.Fatalf("Run = %v, want ErrPublicationMissing with the ALTER PUBLICATION that adds ferry_migration_step", err)
	}

	// With them, the slot is still missing: named too.
	if _, err := b.db.Pool.Exec(b.ctx, `ALTER PUBLICATION ferry ADD TABLE ferry_migration_step`); err != nil {
		t.Fatal(err)
	}
	err = r.Run(b.ctx)
	if !isFatal(err, relay.ErrSlotMissing) || !strings.Contains(err.Error(), b.slot) {
		t.Fatalf("Run = %v, want ErrSlotMissing naming %s", err, b.slot)
	}

}

// The least-privilege role docs/relay.md documents is enough: REPLICATION,
// SELECT on outbox, SELECT and INSERT on outbox_quarantine, SELECT, INSERT
// and UPDATE on ferry_relay_slot, SELECT on the migration plans, with the slot and publication made
// beforehand by relay.Setup.
func TestLeastPrivilegeRoleRelays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 1)
	role := "relay_" + b.slot
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN REPLICATION`,
		`GRANT SELECT ON outbox TO ` + role,
		`GRANT SELECT, INSERT ON outbox_quarantine TO ` + role,
		`GRANT SELECT, INSERT, UPDATE ON ferry_relay_slot TO ` + role,
		`GRANT SELECT ON ferry_migration, ferry_migration_step TO ` + role,
	} {
		if _, err := b.db.Pool.Exec(b.ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = b.db.Pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = b.db.Pool.Exec(context.Background(), `DROP ROLE `+role)
	})
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, "ferry", nil); err != nil {
		t.Fatal(err)
	}
	cfg := b.cfg
	cfg.DatabaseURL = strings.Replace(b.db.URL, "ferry:ferry@", role+"@", 1)
	cfg.NoCreate = true
	b.start(t, cfg)
	ids := b.write(t, evt("order", "o", 1), evt("bad topic", "o", 2))
	consume(t, []string{topic}, ids[:1], time.Minute, 0)
	waitQuarantined(t, b, 1)
}
