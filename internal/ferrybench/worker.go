package main

import (
	"context"
	"fmt"
	"slices"
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
	"github.com/ferryhq/ferry/internal/stats"
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

// workerShape lays out a worker run: the topic's partitions, the worker's
// settings, and how many distinct keys (accounts) the messages spread over,
// message i going to partition i % partitions with key i % keys.
type workerShape struct {
	partitions, concurrency, keyConcurrency, batch, keys int
}

// shapeOf is the worker benchmark's shape with batch messages per
// transaction.
func shapeOf(batch int) workerShape {
	return workerShape{partitions: workerPartitions, concurrency: workerConcurrency, keyConcurrency: 1, batch: batch, keys: workerAccounts}
}

type workerOpts struct {
	onePerTx, batched int // messages in the one-per-transaction and batched runs
	batch             int
	runs              int // samples of the worker and of its ceiling, interleaved
}

// workerResult is one configuration: the worker's rate from Kafka to
// committed effects, next to the SQL-only ceiling of the same statements,
// sampled in turn (ceiling, worker, ceiling, worker, ...) from the same
// table state.
type workerResult struct {
	batch, n int
	rate     samples // msg/s
	ceiling  samples // msg/s
}

func benchWorkers(ctx context.Context, e *env, o workerOpts) ([]workerResult, error) {
	var out []workerResult
	for _, c := range []struct{ batch, n int }{{1, o.onePerTx}, {o.batch, o.batched}} {
		r, err := benchWorker(ctx, e, c.batch, c.n, max(o.runs, 1))
		if err != nil {
			return nil, err
		}
		log("worker batch %d: %s msg/s, ceiling %s msg/s", c.batch, r.rate.Format("%.0f"), r.ceiling.Format("%.0f"))
		out = append(out, r)
	}
	return out, nil
}

func benchWorker(ctx context.Context, e *env, batch, n, runs int) (workerResult, error) {
	res := workerResult{batch: batch, n: n}
	s := shapeOf(batch)
	wt, err := newWorkerTopic(ctx, e, s, n, s.concurrency+2)
	if err != nil {
		return res, err
	}
	defer wt.close()
	pool := wt.pool

	// A warm-up that opens every connection, as the worker's own start
	// does.
	if err := resetWorkerTables(ctx, pool); err != nil {
		return res, err
	}
	if _, err := workerCeiling(ctx, pool, "warmup", min(n, 2000), batch); err != nil {
		return res, err
	}
	for i := range runs {
		// The ceiling and the worker of a sample claim the same messages
		// for the same consumer, each from the same reset state.
		consumer := fmt.Sprintf("bench_%d", i)
		if err := resetWorkerTables(ctx, pool); err != nil {
			return res, err
		}
		c, err := workerCeiling(ctx, pool, consumer, n, batch)
		if err != nil {
			return res, err
		}
		res.ceiling = append(res.ceiling, c)
		if err := resetWorkerTables(ctx, pool); err != nil {
			return res, err
		}
		r, err := workerOnce(ctx, e, pool, wt.topic, consumer, n, s)
		if err != nil {
			return res, err
		}
		res.rate = append(res.rate, r)
		log("worker batch %d, sample %d: ceiling %.0f msg/s, worker %.0f msg/s (%.2f)", batch, i+1, c, r, r/c)
	}
	return res, nil
}

// workerTopic is a database of its own with the benchmark's accounts table,
// and a topic holding n messages laid out by a shape's partitions and keys,
// which every sample reads whole as a consumer group of its own.
type workerTopic struct {
	pool  *pgxpool.Pool
	topic string
	close func()
}

func newWorkerTopic(ctx context.Context, e *env, s workerShape, n, conns int) (_ *workerTopic, err error) {
	wt := &workerTopic{topic: "bench.worker." + ferrytest.Suffix()}
	var undo []func()
	wt.close = func() {
		for _, f := range slices.Backward(undo) {
			f()
		}
	}
	defer func() {
		if err != nil {
			wt.close()
		}
	}()
	url, drop, err := ferrytest.MainDB("bench_worker")
	if err != nil {
		return nil, err
	}
	undo = append(undo, drop)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(conns)
	if wt.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, err
	}
	undo = append(undo, wt.pool.Close)
	if _, err := wt.pool.Exec(ctx, `CREATE TABLE bench_accounts (id int PRIMARY KEY, balance bigint NOT NULL, version int NOT NULL)`); err != nil {
		return nil, err
	}
	kcl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(1<<20))
	if err != nil {
		return nil, err
	}
	undo = append(undo, kcl.Close)
	adm := kadm.NewClient(kcl)
	if _, err := adm.CreateTopic(ctx, int32(s.partitions), 1, nil, wt.topic); err != nil {
		return nil, err
	}
	undo = append(undo, func() { _, _ = adm.DeleteTopics(context.Background(), wt.topic) })
	recs := make([]*kgo.Record, 0, 5000)
	for i := range n {
		recs = append(recs, &kgo.Record{
			Topic: wt.topic, Partition: int32(i % s.partitions), Key: []byte(strconv.Itoa(i % s.keys)),
			Value:   []byte(`{"amount":1}`),
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderID, Value: []byte(messageID(i))}},
		})
		if len(recs) == cap(recs) || i == n-1 {
			if err := kcl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				return nil, err
			}
			recs = recs[:0]
		}
	}
	return wt, nil
}

func messageID(i int) string { return "w-" + strconv.Itoa(i) }

// resetWorkerTables puts what the worker and its ceiling write back in the
// same state before every sample: an empty inbox (and more tables, empty
// too), fresh accounts, all vacuumed, then a checkpoint, so that every
// sample pays the same full-page writes.
func resetWorkerTables(ctx context.Context, pool *pgxpool.Pool, more ...string) error {
	tables := strings.Join(append([]string{"inbox", "bench_accounts"}, more...), ", ")
	for _, q := range []string{
		`TRUNCATE ` + tables,
		fmt.Sprintf(`INSERT INTO bench_accounts SELECT i, 0, 0 FROM generate_series(0, %d) i`, workerAccounts-1),
		`VACUUM (ANALYZE) ` + tables,
		`CHECKPOINT`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("reset the worker's tables: %s: %w", q, err)
		}
	}
	return nil
}

// workerOnce runs an inbox.Worker shaped by s as consumer over topic's n
// messages and returns messages/s from the moment its group is joined to the last
// commit.
func workerOnce(ctx context.Context, e *env, pool *pgxpool.Pool, topic, consumer string, n int, s workerShape) (float64, error) {
	return runWorker(ctx, &inbox.Config{
		DB:             pool,
		KafkaOpts:      []kgo.Opt{kgo.SeedBrokers(e.brokers...)},
		Concurrency:    s.concurrency,
		KeyConcurrency: s.keyConcurrency,
		BatchSize:      s.batch,
	}, topic, consumer, n)
}

// runWorker runs a worker of cfg (Kafka or RabbitMQ) with the benchmark's
// handler as consumer over topic's n messages and returns messages/s from
// the moment it is ready to the last commit.
func runWorker(ctx context.Context, cfg *inbox.Config, topic, consumer string, n int) (float64, error) {
	return runWorkerUntil(ctx, cfg, topic, consumer, n, nil, nil)
}

// runWorkerUntil is runWorker whose run, when settle is not nil, ends
// only once settle returns after the last commit.
func runWorkerUntil(ctx context.Context, cfg *inbox.Config, topic, consumer string, n int, settle func(context.Context) error, cost *workerCost) (float64, error) {
	w, err := inbox.New(cfg)
	if err != nil {
		return 0, err
	}
	w.Handle(consumer, topic, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
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
	for w.Ready() != nil {
		select {
		case err := <-done:
			return 0, fmt.Errorf("worker stopped before joining: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	start := time.Now()
	var mark costMark
	if cost != nil {
		if mark, err = markCost(ctx, cfg.DB); err != nil {
			return 0, err
		}
	}
	for w.Stats().Processed < int64(n) {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		time.Sleep(time.Millisecond)
	}
	if settle != nil {
		if err := settle(ctx); err != nil {
			return 0, err
		}
	}
	elapsed := time.Since(start)
	if cost != nil {
		if *cost, err = mark.per(ctx, cfg.DB, n); err != nil {
			return 0, err
		}
	}
	stop()
	if err := <-done; err != nil {
		return 0, err
	}
	if st := w.Stats(); st.Processed != int64(n) || st.Duplicates != 0 || st.DeadLettered != 0 {
		return 0, fmt.Errorf("worker stats %+v, want %d processed and nothing else", st, n)
	}
	return float64(n) / elapsed.Seconds(), nil
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
						if _, err := q.InboxInsert(ctx, tx, dbsqlc.InboxInsertParams{Consumer: consumer, MessageID: messageID(i)}); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, workerUpdate, i%workerAccounts)
						return err
					}
					msgIDs := make([]string, len(chunk))
					for j, i := range chunk {
						msgIDs[j] = messageID(i)
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
	runs := 0
	if len(rs) > 0 {
		runs = len(rs[0].rate)
	}
	fmt.Fprintf(&b, "| worker figure (%d partitions, concurrency %d, one UPDATE per message; median (min–max) of %d samples each, ceiling and worker in turn) | worker | SQL-only ceiling | worker / ceiling (range of the pairs) | target |\n|---|---|---|---|---|\n",
		workerPartitions, workerConcurrency, runs)
	for _, r := range rs {
		what := "one message per transaction"
		if r.batch > 1 {
			what = fmt.Sprintf("batches of %d messages, a savepoint each", r.batch)
		}
		fmt.Fprintf(&b, "| %s, %d messages | %s msg/s | %s msg/s | **%.2f** (%s) | >= 0.80 |\n", what, r.n,
			r.rate.Format("%.0f"), r.ceiling.Format("%.0f"), r.rate.Median()/r.ceiling.Median(), stats.Ratios(r.rate, r.ceiling).Range("%.2f"))
	}
	fmt.Fprintf(&b, "\nThe SQL-only ceiling: %d clients, each owning one partition's messages, send the worker's own statements for the same messages and consumer "+
		"(InboxInsert, or InboxInsertMany then a savepoint per message, and the handler's UPDATE, in one transaction) straight to PostgreSQL, with no Kafka; "+
		"before every sample of either, the inbox and the accounts are truncated, refilled, vacuumed and checkpointed.\n", workerConcurrency)
	return b.String()
}
