package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// The worker benchmark's shape, as inbox/bench_test.go's: as many partitions
// as transactions in flight, accounts spread so that no two partitions touch
// the same row, one UPDATE per message.
const (
	workerPartitions  = 8
	workerConcurrency = 8
	workerAccounts    = 10_000
	workerUpdate      = `UPDATE bench_accounts SET balance = balance + 1, version = version + 1 WHERE id = $1`
	// The savepoint statements the worker sends around each message of a
	// batch (inbox/apply.go).
	savepointFirst = "SAVEPOINT ferry_message"
	savepointNext  = "RELEASE SAVEPOINT ferry_message; SAVEPOINT ferry_message"
)

type workerOpts struct {
	onePerTx, batched int // messages in the one-per-transaction and batched runs
	batch             int
}

// workerResult is one configuration: the worker's rate from Kafka to
// committed effects, next to the SQL-only ceiling of the same statements.
type workerResult struct {
	batch, n int
	rate     float64 // msg/s
	ceiling  float64 // msg/s, mean of a run before and one after the worker
}

func benchWorkers(ctx context.Context, e *env, o workerOpts) ([]workerResult, error) {
	var out []workerResult
	for _, c := range []struct{ batch, n int }{{1, o.onePerTx}, {o.batch, o.batched}} {
		r, err := benchWorker(ctx, e, c.batch, c.n)
		if err != nil {
			return nil, err
		}
		log("worker batch %d: %.0f msg/s, ceiling %.0f msg/s", c.batch, r.rate, r.ceiling)
		out = append(out, r)
	}
	return out, nil
}

func benchWorker(ctx context.Context, e *env, batch, n int) (workerResult, error) {
	res := workerResult{batch: batch, n: n}
	url, drop, err := ferrytest.MainDB("bench_worker")
	if err != nil {
		return res, err
	}
	defer drop()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return res, err
	}
	pcfg.MaxConns = workerConcurrency + 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_accounts (id int PRIMARY KEY, balance bigint NOT NULL, version int NOT NULL)`); err != nil {
		return res, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO bench_accounts SELECT i, 0, 0 FROM generate_series(0, $1 - 1) i`, workerAccounts); err != nil {
		return res, err
	}

	// The ceiling, after a warm-up that opens every connection, as the
	// worker's own start does.
	if _, err := workerCeiling(ctx, pool, "warmup", min(n, 2000), batch); err != nil {
		return res, err
	}
	before, err := workerCeiling(ctx, pool, "ceiling-before", n, batch)
	if err != nil {
		return res, err
	}

	// The worker, on a topic holding the same n messages.
	kcl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(1<<20))
	if err != nil {
		return res, err
	}
	defer kcl.Close()
	adm := kadm.NewClient(kcl)
	topic := "bench.worker." + ferrytest.Suffix()
	if _, err := adm.CreateTopic(ctx, workerPartitions, 1, nil, topic); err != nil {
		return res, err
	}
	defer func() { _, _ = adm.DeleteTopics(context.Background(), topic) }()
	recs := make([]*kgo.Record, 0, 5000)
	for i := range n {
		recs = append(recs, &kgo.Record{
			Topic: topic, Partition: int32(i % workerPartitions), Key: []byte(strconv.Itoa(i % workerAccounts)),
			Value:   []byte(`{"amount":1}`),
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderID, Value: []byte("w-" + strconv.Itoa(i))}},
		})
		if len(recs) == cap(recs) || i == n-1 {
			if err := kcl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				return res, err
			}
			recs = recs[:0]
		}
	}
	w, err := inbox.New(&inbox.Config{
		DB:          pool,
		KafkaOpts:   []kgo.Opt{kgo.SeedBrokers(e.brokers...)},
		Concurrency: workerConcurrency,
		BatchSize:   batch,
	})
	if err != nil {
		return res, err
	}
	w.Handle("bench", topic, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		id, err := strconv.Atoi(string(m.Key))
		if err != nil {
			return inbox.Permanent(err)
		}
		_, err = tx.Exec(ctx, workerUpdate, id)
		return err
	})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	// Time from the moment the group is joined to the last commit.
	for w.Ready() != nil {
		select {
		case err := <-done:
			return res, fmt.Errorf("worker stopped before joining: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	start := time.Now()
	for w.Stats().Processed < int64(n) {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	stop()
	if err := <-done; err != nil {
		return res, err
	}
	if st := w.Stats(); st.Processed != int64(n) || st.Duplicates != 0 || st.DeadLettered != 0 {
		return res, fmt.Errorf("worker stats %+v, want %d processed and nothing else", st, n)
	}
	after, err := workerCeiling(ctx, pool, "ceiling-after", n, batch)
	if err != nil {
		return res, err
	}
	// The mean of before and after cancels a drift of the machine's load.
	res.ceiling = (before + after) / 2
	res.rate = float64(n) / elapsed.Seconds()
	return res, nil
}

// workerCeiling runs the worker's statements for n messages straight
// against PostgreSQL: workerConcurrency clients, each owning the messages of
// one partition, batch messages per transaction. It returns messages/s.
func workerCeiling(ctx context.Context, pool *pgxpool.Pool, consumer string, n, batch int) (float64, error) {
	q := dbsqlc.New()
	var wg sync.WaitGroup
	errs := make(chan error, workerConcurrency)
	start := time.Now()
	for p := range workerConcurrency {
		wg.Go(func() {
			var ids []int
			for i := p; i < n; i += workerConcurrency {
				ids = append(ids, i)
			}
			for len(ids) > 0 {
				chunk := ids[:min(batch, len(ids))]
				ids = ids[len(chunk):]
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if batch == 1 {
						i := chunk[0]
						if _, err := q.InboxInsert(ctx, tx, dbsqlc.InboxInsertParams{Consumer: consumer, MessageID: "c-" + strconv.Itoa(i)}); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, workerUpdate, i%workerAccounts)
						return err
					}
					msgIDs := make([]string, len(chunk))
					for j, i := range chunk {
						msgIDs[j] = "c-" + strconv.Itoa(i)
					}
					if _, err := q.InboxInsertMany(ctx, tx, dbsqlc.InboxInsertManyParams{Consumer: consumer, MessageIds: msgIDs}); err != nil {
						return err
					}
					for j, i := range chunk {
						sp := savepointNext
						if j == 0 {
							sp = savepointFirst
						}
						if _, err := tx.Exec(ctx, sp); err != nil {
							return err
						}
						if _, err := tx.Exec(ctx, workerUpdate, i%workerAccounts); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

func workerMarkdown(rs []workerResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| worker figure (%d partitions, concurrency %d, one UPDATE per message) | worker | SQL-only ceiling | worker / ceiling |\n|---|---|---|---|\n",
		workerPartitions, workerConcurrency)
	for _, r := range rs {
		what := "one message per transaction"
		if r.batch > 1 {
			what = fmt.Sprintf("batches of %d messages, a savepoint each", r.batch)
		}
		fmt.Fprintf(&b, "| %s, %d messages | %.0f msg/s | %.0f msg/s | **%.2f** |\n", what, r.n, r.rate, r.ceiling, r.rate/r.ceiling)
	}
	return b.String()
}
