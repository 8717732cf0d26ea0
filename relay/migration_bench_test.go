package relay_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ferryhq/ferry/migration"
)

// BenchmarkRelayDualWrite measures what dual writing costs: one relay, on
// the same database, slot and topics, drains a backlog of b.N events (one
// transaction) alternately writing one channel (OLD_ONLY) and two
// (DUAL_WRITE: cluster A and cluster B, every copy stamped and acknowledged
// before the position is confirmed), three rounds each, and reports the
// median rate of each, their range, and the ratio of the medians:
//
//	go test -run '^$' -bench DualWrite -benchtime 20000x ./relay
func BenchmarkRelayDualWrite(bm *testing.B) {
	m := setupMigration(bm, 4, 4, nil)
	dualWriteRatio(bm, m)
}

// BenchmarkRelayDualWriteToRabbitMQ is BenchmarkRelayDualWrite with the
// stack's RabbitMQ as the new channel (16 shards, publisher confirms on
// every copy before the position is confirmed): the relay's Kafka drain
// alone, and while it also writes RabbitMQ, in the same run.
//
//	go test -run '^$' -bench DualWriteToRabbitMQ -benchtime 20000x ./relay
func BenchmarkRelayDualWriteToRabbitMQ(bm *testing.B) {
	m := setupMigrationToRabbitMQ(bm, 4, "test")
	dualWriteRatio(bm, m)
}

// dualWriteRatio drains b.N events three times on one channel and three
// times on two, alternately, and reports the medians and their ratio.
func dualWriteRatio(bm *testing.B, m *migrationBundle) {
	m.start(bm, m.cfg)
	drain := func() float64 {
		var target string
		start := time.Now()
		if err := m.db.Pool.QueryRow(m.ctx, `
			WITH ins AS (
				INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
				SELECT gen_random_uuid(), 'order', 'agg-' || (i % 1000), 'Changed', convert_to(repeat('x', 200), 'UTF8'), '{"k":"v"}'
				FROM generate_series(1, $1::int) i RETURNING 1)
			SELECT pg_current_wal_insert_lsn()::text FROM (SELECT count(*) FROM ins) c`, bm.N).Scan(&target); err != nil {
			bm.Fatal(err)
		}
		for {
			var done bool
			if err := m.db.Pool.QueryRow(m.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
				m.slot, target).Scan(&done); err != nil {
				bm.Fatal(err)
			}
			if done {
				return float64(bm.N) / time.Since(start).Seconds()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	bm.ResetTimer()
	var single, dual []float64
	for range 3 {
		single = append(single, drain())
		m.request(bm, migration.DualWrite, 0)
		dual = append(dual, drain())
		m.request(bm, migration.OldOnly, 0)
	}
	bm.StopTimer()
	bm.ReportMetric(median(single), "single_events/s")
	bm.ReportMetric(median(dual), "dual_events/s")
	bm.ReportMetric(median(dual)/median(single), "ratio")
	bm.Logf("one channel %.0f events/s (%s), two channels %.0f events/s (%s), ratio %.2f",
		median(single), spread(single), median(dual), spread(dual), median(dual)/median(single))
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}

func spread(xs []float64) string {
	s := slices.Sorted(slices.Values(xs))
	return fmt.Sprintf("%.0f-%.0f", s[0], s[len(s)-1])
}
