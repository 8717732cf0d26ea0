package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// peer is one relay under test. The driver gives each its own database and
// topic and asks the same of each: a backlog written before it starts, then
// events offered at a fixed rate while it runs.
type peer interface {
	// Name is the column heading in the results.
	Name() string
	// Prepare makes the peer's database objects and topic; Close undoes it.
	Prepare(ctx context.Context) error
	Close()
	// WriteBacklog writes n events before the peer starts, in transactions
	// of perTx (the last may be smaller).
	WriteBacklog(ctx context.Context, n, perTx int) error
	// Start starts the peer's relay process.
	Start(ctx context.Context) (*process, error)
	// Ready reports whether the started process says it is ready: its
	// readiness probe, or its own log line.
	Ready(ctx context.Context, p *process) (bool, error)
	// Confirmed is the position the peer last recorded as done (a slot's
	// confirmed_flush_lsn, a Watermill offsets row), and whether it covers
	// the backlog.
	Confirmed(ctx context.Context) (mark string, backlogDone bool, err error)
	// Topic is the Kafka topic the peer's events go to.
	Topic() string
	// IDHeader is the record header holding the event's id.
	IDHeader() string
	// Offer writes rate events per second for dur, each in a transaction of
	// its own, and calls committed with each event's id and the time its
	// commit returned.
	Offer(ctx context.Context, rate int, dur time.Duration, committed func(id string, at time.Time)) error
	// Settings are printed with the results.
	Settings() string
	// Marks says how the peer records its progress.
	Marks() string
}

// bench is what every peer shares: the stack, a scratch directory, the
// run's suffix for unique names, the binaries.
type bench struct {
	brokers       []string
	dir           string
	suffix        string
	payload       int
	partitions    int32
	relayBin      string
	relayArgs     []string // more flags of the relay's run command
	java          string
	debeziumLib   string
	debeziumLog4j string
	jvmOpts       []string
	watermill     string
	rabbit        *rabbitTarget // set: the peers publish to RabbitMQ instead of Kafka
}

func (b *bench) topic(peer string) string {
	return fmt.Sprintf("peers.%s.%s.load", b.suffix, peer)
}

// freeAddr returns a loopback address no one listens on right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// logHas reports whether the file holds a line containing s.
func logHas(file, s string) bool {
	b, err := os.ReadFile(file)
	return err == nil && strings.Contains(string(b), s)
}

// outboxDB is Ferry's outbox table in a database of its own, read by a
// logical replication slot: the source of Ferry's relay and of Debezium.
type outboxDB struct {
	url, slot string
	pool      *pgxpool.Pool
	drop      func()
	target    string // WAL insert position before the backlog's last row
}

func (o *outboxDB) prepare(ctx context.Context, name, slot string) error {
	url, drop, err := ferrytest.MainDB(name)
	if err != nil {
		return err
	}
	o.url, o.drop, o.slot = url, drop, slot
	if o.pool, err = pgxpool.New(ctx, url); err != nil {
		return err
	}
	if _, err := o.pool.Exec(ctx, `CREATE PUBLICATION ferry FOR TABLE outbox WITH (publish = 'insert')`); err != nil {
		return err
	}
	// The slot exists before the backlog is written, so the peer sees all of it.
	_, err = o.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	return err
}

func (o *outboxDB) close() {
	if o.pool != nil {
		o.pool.Close()
	}
	if o.drop != nil {
		o.drop() // drops the slot with the database
	}
}

// writeBacklog writes the relay benchmark's rows (internal/ferrybench):
// 1,000 aggregates, payload bytes of 'x', one header, in transactions of
// perTx (the first n-1 rows without waiting for each commit's flush, from
// a procedure, when perTx is less than n).
//
// The target is the WAL insert position just before the last row, taken
// inside its transaction: the last row's record starts at or after it.
// Ferry's relay confirms the end of a transaction's commit record; Debezium
// confirms the position of the last record Kafka acknowledged (without
// transaction metadata no record carries the commit), so it never confirms
// this transaction's commit. Each passes the target once Kafka has the last
// row, and neither before.
func (o *outboxDB) writeBacklog(ctx context.Context, n, perTx, payload int) error {
	const insert = `
		INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT gen_random_uuid(), 'load', 'agg-' || (i % 1000), 'Changed', convert_to(repeat('x', $3), 'UTF8'), '{"k":"v"}'
		FROM generate_series($1::int, $2::int) i`
	// The last transaction holds rows first to n; the ones before it a
	// multiple of perTx (all of them in one when perTx >= n).
	first := n - (n-1)%max(perTx, 1)
	if err := o.writeShaped(ctx, first-1, perTx, payload); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insert, first, n-1, payload); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&o.target); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insert, n, n, payload)
		return err
	})
}

// writeShaped commits rows 1 to n in transactions of perTx from a
// procedure, without waiting for each commit's flush.
func (o *outboxDB) writeShaped(ctx context.Context, n, perTx, payload int) error {
	if n < 1 {
		return nil
	}
	if _, err := o.pool.Exec(ctx, `
		CREATE OR REPLACE PROCEDURE peers_backlog(n int, per_tx int, payload int) LANGUAGE plpgsql AS $$
		DECLARE
			written int := 0;
		BEGIN
			WHILE written < n LOOP
				INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
				SELECT gen_random_uuid(), 'load', 'agg-' || (i % 1000), 'Changed', convert_to(repeat('x', payload), 'UTF8'), '{"k":"v"}'
				FROM generate_series(written + 1, least(written + per_tx, n)) i;
				written := written + per_tx;
				COMMIT;
			END LOOP;
		END $$`); err != nil {
		return err
	}
	return ferrytest.ExecUnflushed(ctx, o.pool, `CALL peers_backlog($1, $2, $3)`, n, perTx, payload)
}

func (o *outboxDB) confirmed(ctx context.Context) (string, bool, error) {
	var lsn string
	var done bool
	err := o.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, confirmed_flush_lsn >= $2::pg_lsn
		FROM pg_replication_slots WHERE slot_name = $1`, o.slot, o.target).Scan(&lsn, &done)
	return lsn, done, err
}

// writersFor is how many writers offer rate events/s: one per 250 events/s,
// at least four, so that no writer falls behind waiting on its own commits
// (a commit's flush takes about a millisecond here).
func writersFor(rate int) int { return max(4, rate/250) }

// offer writes through outbox.Write, as an application does, from
// writersFor(rate) writers, as internal/ferrybench's latency phase.
func (o *outboxDB) offer(ctx context.Context, rate int, dur time.Duration, payload int, committed func(string, time.Time)) error {
	writers := writersFor(rate)
	interval := time.Duration(float64(time.Second) * float64(writers) / float64(rate))
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; time.Since(start) < dur; i++ {
				<-tick.C
				ids, err := outbox.Write(ctx, o.pool, outbox.Event{
					AggregateType: "load", AggregateID: fmt.Sprintf("w%d-%d", w, i%100), EventType: "Changed",
					Payload: bytes.Repeat([]byte("x"), payload), Headers: map[string]string{"k": "v"},
				})
				if err != nil {
					errs <- err
					return
				}
				committed(ids[0].String(), time.Now())
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
