package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// drainSetup is what a drain benchmark starts from: a database of its own
// with Ferry's schema and the relay's publication, a pool on it, and a
// Kafka admin client. Its cleanups run in reverse on close.
type drainSetup struct {
	url      string
	pool     *pgxpool.Pool
	adm      *kadm.Client
	cleanups []func()
}

func newDrainSetup(ctx context.Context, e *env, prefix string) (s *drainSetup, err error) {
	s = &drainSetup{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	url, drop, err := ferrytest.MainDB(prefix)
	if err != nil {
		return nil, err
	}
	s.url, s.cleanups = url, append(s.cleanups, drop)
	if s.pool, err = pgxpool.New(ctx, url); err != nil {
		return nil, err
	}
	s.cleanups = append(s.cleanups, s.pool.Close)
	kcl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		return nil, err
	}
	s.adm, s.cleanups = kadm.NewClient(kcl), append(s.cleanups, kcl.Close)
	if _, err := s.pool.Exec(ctx, `CREATE PUBLICATION ferry FOR TABLE outbox WITH (publish = 'insert')`); err != nil {
		return nil, err
	}
	return s, nil
}

// topics creates each topic with 4 partitions, deleted on close.
func (s *drainSetup) topics(ctx context.Context, names ...string) error {
	return s.topicsOn(ctx, s.adm, 4, names...)
}

// topicsOn creates each topic with partitions partitions through adm (a
// cluster's admin client), deleted on close.
func (s *drainSetup) topicsOn(ctx context.Context, adm *kadm.Client, partitions int32, names ...string) error {
	for _, t := range names {
		if _, err := adm.CreateTopic(ctx, partitions, 1, nil, t); err != nil {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
		s.cleanups = append(s.cleanups, func() { _, _ = adm.DeleteTopics(context.Background(), t) })
	}
	return nil
}

// slots creates the slots, dropped on close: the first, then copies of
// it, so that all start at the same LSN. Made before a backlog, each sees
// all of it.
func (s *drainSetup) slots(ctx context.Context, names ...string) error {
	for i, name := range names {
		q, args := `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, []any{name}
		if i > 0 {
			q, args = `SELECT pg_copy_logical_replication_slot($1, $2)`, []any{names[0], name}
		}
		if _, err := s.pool.Exec(ctx, q, args...); err != nil {
			return fmt.Errorf("create slot %s: %w", name, err)
		}
		s.cleanups = append(s.cleanups, func() { _, _ = s.pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, name) })
	}
	return nil
}

func (s *drainSetup) close() {
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		s.cleanups[i]()
	}
	s.cleanups = nil
}
