package relay_test

import (
	"testing"
	"time"
)

// BenchmarkRelayDrain drains a backlog of b.N events into Kafka in-process,
// for profiling:
//
//	go test -run '^$' -bench Drain -benchtime 200000x -cpuprofile cpu.out ./relay
//
// The figures against the server's own decode rate come from
// `go run ./internal/ferrybench relay`.
func BenchmarkRelayDrain(bm *testing.B) {
	b := setup(bm)
	topic := b.topic(bm, "load", 4)
	_ = topic
	slot := b.slot
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE PUBLICATION ferry FOR TABLE outbox WITH (publish = 'insert')`); err != nil {
		bm.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		bm.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `
		INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT gen_random_uuid(), 'load', 'agg-' || (i % 1000), 'Changed', convert_to(repeat('x', 200), 'UTF8'), '{"k":"v"}'
		FROM generate_series(1, $1) i`, bm.N); err != nil {
		bm.Fatal(err)
	}
	var target string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		bm.Fatal(err)
	}
	bm.ResetTimer()
	b.start(bm, b.cfg)
	for {
		var done bool
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, slot, target).Scan(&done); err != nil {
			bm.Fatal(err)
		}
		if done {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	bm.StopTimer()
	bm.ReportMetric(float64(bm.N)/bm.Elapsed().Seconds(), "events/s")
}

// BenchmarkRelayDrainRabbitMQ is BenchmarkRelayDrain into RabbitMQ: the
// backlog drains into a declared shard topology (16 quorum queues), behind
// publisher confirms on the default 4 channels.
func BenchmarkRelayDrainRabbitMQ(bm *testing.B) {
	b := rabbitSetup(bm)
	declare(bm, b.prefix+".load")
	slot := b.slot
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE PUBLICATION ferry FOR TABLE outbox WITH (publish = 'insert')`); err != nil {
		bm.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		bm.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `
		INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		SELECT gen_random_uuid(), 'load', 'agg-' || (i % 1000), 'Changed', convert_to(repeat('x', 200), 'UTF8'), '{"k":"v"}'
		FROM generate_series(1, $1) i`, bm.N); err != nil {
		bm.Fatal(err)
	}
	var target string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		bm.Fatal(err)
	}
	bm.ResetTimer()
	b.start(bm, b.cfg)
	for {
		var done bool
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, slot, target).Scan(&done); err != nil {
			bm.Fatal(err)
		}
		if done {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	bm.StopTimer()
	bm.ReportMetric(float64(bm.N)/bm.Elapsed().Seconds(), "events/s")
}
