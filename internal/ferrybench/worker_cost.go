package main

import (
	"context"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/procs"
	"github.com/ferryhq/ferry/outbox"
)

// workerCost is what a worker's run cost per message: µs of CPU of this
// process (the in-process worker, its Kafka clients and pool), µs of CPU of
// the machine's PostgreSQL processes (its backends, the WAL writer, the
// checkpointer, autovacuum), and the bytes of WAL PostgreSQL wrote.
type workerCost struct{ worker, postgres, wal float64 }

// costMark is a reading of what workerCost counts.
type costMark struct {
	self float64
	pg   map[int]float64 // by pid
	wal  int64
}

func markCost(ctx context.Context, db outbox.Beginner) (costMark, error) {
	m := costMark{pg: map[int]float64{}}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&m.wal)
	})
	if err != nil {
		return m, err
	}
	if m.self, err = procs.CPUSeconds(os.Getpid()); err != nil {
		return m, err
	}
	for _, pid := range postgresPids(0) {
		if cpu, err := procs.CPUSeconds(pid); err == nil {
			m.pg[pid] = cpu
		}
	}
	return m, nil
}

// per is the cost of n messages from m until now. A PostgreSQL process
// started meanwhile counts in full; one that ended is not counted.
func (m costMark) per(ctx context.Context, db outbox.Beginner, n int) (workerCost, error) {
	now, err := markCost(ctx, db)
	if err != nil {
		return workerCost{}, err
	}
	var pg float64
	for pid, cpu := range now.pg {
		pg += cpu - m.pg[pid]
	}
	f := float64(n)
	return workerCost{worker: (now.self - m.self) * 1e6 / f, postgres: pg * 1e6 / f, wal: float64(now.wal-m.wal) / f}, nil
}
