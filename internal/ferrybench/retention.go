package main

// ferrybench retention: what expiring the same outbox rows costs in the
// plain layout (relay.Prune's batched DELETE, then the VACUUM the deletes
// leave behind) and in the partitioned one (relay.Prune fencing and
// dropping day partitions): time, WAL written, the table's size after, and
// the commit latency of a writer that keeps writing events meanwhile.
//
//	go run ./internal/ferrybench retention [-rows 10000000] [-days 10] [-batch 10000] [-rate 200]

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/schema"
)

type retentionOpts struct {
	rows     int
	days     int // the expired rows span this many whole past days
	batch    int // rows per DELETE of the plain layout
	rate     int // writer transactions per second
	baseline time.Duration
	payload  int
}

// retentionResult is one layout's run.
type retentionResult struct {
	layout          string
	load            time.Duration
	prune           *relay.PruneResult
	elapsed         time.Duration
	wal, writerWAL  int64 // WAL written during retention; the writer's estimated share
	sizeBefore      int64
	sizeAfter       int64
	vacuum          time.Duration
	vacuumWAL       int64
	sizeVacuumed    int64
	baseline, under []float64 // the writer's commit latencies (s), sorted: before and during retention
}

// retentionRetention is the outbox retention of the runs: every loaded row
// is older than it, in whole days.
const retentionRetention = 7 * 24 * time.Hour

func runRetention(ctx context.Context, fs *flag.FlagSet, args []string) error {
	var o retentionOpts
	fs.IntVar(&o.rows, "rows", 10_000_000, "expired outbox rows loaded into each layout")
	fs.IntVar(&o.days, "days", 10, "whole days the expired rows span, ending at the retention (7 days ago)")
	fs.IntVar(&o.batch, "batch", 10_000, "rows per DELETE of the plain layout's prune (--prune-batch-size)")
	fs.IntVar(&o.rate, "rate", 200, "single-event transactions per second of the concurrent writer")
	fs.DurationVar(&o.baseline, "baseline", 10*time.Second, "how long the writer runs before retention starts, for its baseline latency")
	fs.IntVar(&o.payload, "payload", 200, "payload bytes per row")
	_ = fs.Parse(args)
	var rs []*retentionResult
	var m machine
	for _, partitioned := range []bool{false, true} {
		r, mach, err := retentionRun(ctx, o, partitioned)
		if err != nil {
			return err
		}
		rs, m = append(rs, r), mach
	}
	fmt.Print(retentionMarkdown(o, m, rs))
	return nil
}

func retentionRun(ctx context.Context, o retentionOpts, partitioned bool) (*retentionResult, machine, error) {
	r := &retentionResult{layout: "plain (batched DELETE)"}
	url, drop, err := ferrytest.MainDB("bench_retention")
	if err != nil {
		return nil, machine{}, err
	}
	defer drop()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, machine{}, err
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, machine{}, err
	}
	defer pool.Close()
	m := describeMachine(ctx, pool)
	last := time.Now().UTC().Truncate(24 * time.Hour).Add(-retentionRetention)
	first := last.AddDate(0, 0, -o.days)
	if partitioned {
		r.layout = "partitioned (drop day partitions)"
		if err := schema.PartitionOutbox(ctx, stdlib.OpenDBFromPool(pool), schema.PartitionDaily); err != nil {
			return nil, m, err
		}
		for d := first; d.Before(last); d = d.AddDate(0, 0, 1) {
			if _, err := partition.CreateDay(ctx, pool, partition.Outbox, d); err != nil {
				return nil, m, err
			}
		}
	}
	start := time.Now()
	if err := loadExpired(ctx, pool, o, first, last); err != nil {
		return nil, m, err
	}
	r.load = time.Since(start)
	log("retention %s: loaded %d rows in %s", r.layout, o.rows, r.load.Round(time.Second))

	// The slot starts after the rows, and a stand-in for a relay that is
	// caught up confirms the WAL as it comes, as an idle relay confirms
	// each keepalive's position: what retention waits for is the slot,
	// not the relay's publishing.
	slot := "bench_retention"
	if err := relay.Setup(ctx, pool, slot, "ferry", nil); err != nil {
		return nil, m, err
	}
	advCtx, stopAdvancer := context.WithCancel(ctx)
	defer stopAdvancer()
	go func() {
		for advCtx.Err() == nil {
			_, _ = pool.Exec(advCtx, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, slot)
			time.Sleep(20 * time.Millisecond)
		}
	}()

	w := startRetentionWriter(ctx, pool, o)
	defer w.stop()
	wal0, err := walLSN(ctx, pool)
	if err != nil {
		return nil, m, err
	}
	time.Sleep(o.baseline)
	wal1, err := walLSN(ctx, pool)
	if err != nil {
		return nil, m, err
	}
	writerWALRate := float64(walDiff(ctx, pool, wal1, wal0)) / o.baseline.Seconds()
	if r.sizeBefore, err = outboxSize(ctx, pool); err != nil {
		return nil, m, err
	}
	t0 := time.Now()
	r.prune, err = relay.Prune(ctx, pool, slot, &relay.PruneConfig{Retention: retentionRetention, BatchSize: o.batch, ConfirmWait: 5 * time.Minute})
	if err != nil {
		return nil, m, fmt.Errorf("prune: %w", err)
	}
	t1 := time.Now()
	r.elapsed = t1.Sub(t0)
	wal2, err := walLSN(ctx, pool)
	if err != nil {
		return nil, m, err
	}
	r.wal = walDiff(ctx, pool, wal2, wal1)
	r.writerWAL = int64(writerWALRate * r.elapsed.Seconds())
	if r.sizeAfter, err = outboxSize(ctx, pool); err != nil {
		return nil, m, err
	}
	log("retention %s: expired in %s", r.layout, r.elapsed.Round(time.Millisecond))
	// The row-wise prune leaves dead rows for VACUUM; a dropped partition
	// leaves none. Measured apart, with the writer still on.
	if _, err := pool.Exec(ctx, `VACUUM outbox`); err != nil {
		return nil, m, fmt.Errorf("vacuum: %w", err)
	}
	r.vacuum = time.Since(t1)
	wal3, err := walLSN(ctx, pool)
	if err != nil {
		return nil, m, err
	}
	r.vacuumWAL = walDiff(ctx, pool, wal3, wal2)
	if r.sizeVacuumed, err = outboxSize(ctx, pool); err != nil {
		return nil, m, err
	}
	r.baseline, r.under = w.split(t0, t1)
	return r, m, w.stop()
}

// loadExpired writes o.rows rows created over [first, last), UUIDv7-like
// ids in time order (as the writer's), in statements of a million rows.
func loadExpired(ctx context.Context, pool *pgxpool.Pool, o retentionOpts, first, last time.Time) error {
	const chunk = 1_000_000
	span := last.Sub(first).Seconds()
	for lo := 1; lo <= o.rows; lo += chunk {
		hi := min(lo+chunk-1, o.rows)
		_, err := pool.Exec(ctx, `
			INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
			SELECT (lpad(to_hex(g), 12, '0') || '70008000' || lpad(to_hex(g), 12, '0'))::uuid,
			       'order', (g % 100000)::text, 'OrderPlaced', $1::bytea,
			       $2::timestamptz + make_interval(secs => $3 * (g - 1) / $4)
			FROM generate_series($5::bigint, $6::bigint) g`,
			[]byte(strings.Repeat("x", o.payload)), first, span, float64(o.rows), lo, hi)
		if err != nil {
			return fmt.Errorf("load rows %d-%d: %w", lo, hi, err)
		}
	}
	// The load's dirty pages and WAL are not retention's to pay for.
	_, err := pool.Exec(ctx, `CHECKPOINT`)
	return err
}

func walLSN(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var lsn string
	err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn)
	return lsn, err
}

func walDiff(ctx context.Context, pool *pgxpool.Pool, to, from string) int64 {
	var n int64
	if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, to, from).Scan(&n); err != nil {
		log("wal diff: %v", err)
	}
	return n
}

// outboxSize is the outbox's size with its indexes and TOAST, over every
// partition of a partitioned one.
func outboxSize(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT CASE WHEN relkind = 'p'
		THEN (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox'))
		ELSE pg_total_relation_size('outbox') END::bigint
		FROM pg_class WHERE oid = 'outbox'::regclass`).Scan(&n)
	return n, err
}

// retentionWriter writes single-event transactions at a steady rate from
// four clients and keeps each commit's latency with its start time.
type retentionWriter struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	at     []time.Time
	took   []float64
	errs   []error
	once   sync.Once
	err    error
}

func startRetentionWriter(ctx context.Context, pool *pgxpool.Pool, o retentionOpts) *retentionWriter {
	ctx, cancel := context.WithCancel(ctx)
	w := &retentionWriter{cancel: cancel}
	const clients = 4
	every := time.Duration(clients) * time.Second / time.Duration(o.rate)
	payload := []byte(strings.Repeat("y", o.payload))
	for c := range clients {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			t := time.NewTicker(every)
			defer t.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				start := time.Now()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("w%d-%d", c, i),
						EventType: "OrderPlaced", Payload: payload})
					return err
				})
				took := time.Since(start)
				w.mu.Lock()
				if err != nil && ctx.Err() == nil {
					w.errs = append(w.errs, err)
				} else if err == nil {
					w.at, w.took = append(w.at, start), append(w.took, took.Seconds())
				}
				w.mu.Unlock()
			}
		}()
	}
	return w
}

// stop ends the writer; an error is the first of its failed transactions.
func (w *retentionWriter) stop() error {
	w.once.Do(func() {
		w.cancel()
		w.wg.Wait()
		if len(w.errs) > 0 {
			w.err = fmt.Errorf("writer: %d transactions failed, the first: %w", len(w.errs), w.errs[0])
		}
	})
	return w.err
}

// split returns the latencies of the transactions started before from and
// of those started within [from, to], each sorted.
func (w *retentionWriter) split(from, to time.Time) (before, during []float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, at := range w.at {
		switch {
		case at.Before(from):
			before = append(before, w.took[i])
		case !at.After(to):
			during = append(during, w.took[i])
		}
	}
	slices.Sort(before)
	slices.Sort(during)
	return before, during
}

// pctl is the q quantile of sorted xs, in milliseconds.
func pctl(xs []float64, q float64) string {
	if len(xs) == 0 {
		return "-"
	}
	return ms(xs[min(int(q*float64(len(xs))), len(xs)-1)])
}

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }

func retentionMarkdown(o retentionOpts, m machine, rs []*retentionResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Retention of %d expired outbox rows (%d-byte payloads, created over %d whole days ending %s ago), "+
		"`relay.Prune` with `--outbox-retention %s`; the plain layout deletes %d rows per statement. A writer commits "+
		"single-event `outbox.Write` transactions at %d/s from 4 clients throughout; a stand-in for a caught-up relay "+
		"advances the slot every 20 ms.\n\n", o.rows, o.payload, o.days, retentionRetention, retentionRetention, o.batch, o.rate)
	fmt.Fprintf(&b, "| layout | time to expire | WAL written (the writer's share, estimated) | outbox size before | after | "+
		"then VACUUM: time, WAL, size after | writer p50 / p99 / max before | during retention (transactions) |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %s | %s (%s) | %s | %s | %s, %s, %s | %s / %s / %s | %s / %s / %s (%d) |\n",
			r.layout, r.elapsed.Round(time.Millisecond), mib(r.wal), mib(r.writerWAL), mib(r.sizeBefore), mib(r.sizeAfter),
			r.vacuum.Round(time.Millisecond), mib(r.vacuumWAL), mib(r.sizeVacuumed),
			pctl(r.baseline, .5), pctl(r.baseline, .99), pctl(r.baseline, 1),
			pctl(r.under, .5), pctl(r.under, .99), pctl(r.under, 1), len(r.under))
	}
	for _, r := range rs {
		fmt.Fprintf(&b, "\n%s: %d rows deleted in %d statements, %d partitions dropped; loading took %s.",
			r.layout, r.prune.Deleted, r.prune.Batches, r.prune.PartitionsDropped, r.load.Round(time.Second))
	}
	fmt.Fprintf(&b, "\n\n%s", m.markdown())
	return b.String()
}
