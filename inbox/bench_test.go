package inbox

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// Shape of the benchmark: as many partitions as transactions in flight,
// accounts spread so that no two partitions touch the same row.
const (
	benchPartitions  = 8
	benchConcurrency = 8
	benchAccounts    = 10_000 // a multiple of benchPartitions
)

// BenchmarkWorker measures messages per second from Kafka to a committed
// inbox row plus effect (one UPDATE), one message per transaction and 100
// per transaction, each next to its SQL-only ceiling: the same statements
// (BEGIN, inbox claim, savepoints in batches, the UPDATE, COMMIT) sent
// straight to PostgreSQL by as many clients as the worker's concurrency, with
// the same batch size, in the same run. Each op is one message:
//
//	go test ./inbox -run '^$' -bench Worker -benchtime 20000x -count 5
//
// It reports msg/s (worker), ceiling_msg/s (the mean of a ceiling run
// before and one after the worker's) and ratio (worker / ceiling).
func BenchmarkWorker(bm *testing.B) {
	for _, batch := range []int{1, 100} {
		name := "one_per_transaction"
		if batch > 1 {
			name = fmt.Sprintf("batch_%d", batch)
		}
		bm.Run(name, func(bm *testing.B) { benchWorker(bm, batch) })
	}
}

func benchWorker(bm *testing.B, batch int) {
	bm.StopTimer()
	ctx := ferrytest.Context(bm, 30*time.Minute)
	db := ferrytest.NewMigratedDB(bm)
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		bm.Fatal(err)
	}
	pcfg.MaxConns = benchConcurrency + 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		bm.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_accounts (id int PRIMARY KEY, balance bigint NOT NULL, version int NOT NULL)`); err != nil {
		bm.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO bench_accounts SELECT i, 0, 0 FROM generate_series(0, $1 - 1) i`, benchAccounts); err != nil {
		bm.Fatal(err)
	}
	n := bm.N

	// The ceiling: the worker's statements without Kafka, after a warm-up
	// that opens every connection and fills the caches, as the worker's
	// own start does.
	benchCeiling(bm, ctx, pool, "warmup", min(n, 2000), batch)
	ceilingBefore := benchCeiling(bm, ctx, pool, "ceiling-before", n, batch)

	// The worker, on a topic holding the same n messages.
	topic := ferrytest.Topic(bm, benchPartitions)
	producer := ferrytest.Client(bm, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(1<<20))
	recs := make([]*kgo.Record, 0, 5000)
	for i := range n {
		recs = append(recs, &kgo.Record{
			Topic: topic, Partition: int32(i % benchPartitions), Key: []byte(strconv.Itoa(i % benchAccounts)),
			Value:   []byte(`{"amount":1}`),
			Headers: []kgo.RecordHeader{{Key: HeaderID, Value: []byte("w-" + strconv.Itoa(i))}},
		})
		if len(recs) == cap(recs) || i == n-1 {
			if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				bm.Fatal(err)
			}
			recs = recs[:0]
		}
	}
	w, err := New(&Config{
		DB:          pool,
		KafkaOpts:   []kgo.Opt{kgo.SeedBrokers(ferrytest.Brokers(bm)...)},
		Concurrency: benchConcurrency,
		BatchSize:   batch,
	})
	if err != nil {
		bm.Fatal(err)
	}
	w.Handle("bench", topic, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		id, err := strconv.Atoi(string(m.Key))
		if err != nil {
			return Permanent(err)
		}
		_, err = tx.Exec(ctx, benchUpdate, id)
		return err
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	// Time from the first committed message to the last, so that joining
	// the group and looking up offsets (slow on a loaded broker) are not
	// counted: the rate is over the messages after the first.
	var first int64
	for first == 0 {
		time.Sleep(time.Millisecond)
		first = w.Stats().Processed
	}
	start := time.Now()
	bm.StartTimer()
	for w.Stats().Processed < int64(n) {
		time.Sleep(time.Millisecond)
	}
	bm.StopTimer()
	elapsed := time.Since(start)
	stop()
	if err := <-done; err != nil {
		bm.Fatal(err)
	}
	if st := w.Stats(); st.Processed != int64(n) || st.Duplicates != 0 || st.DeadLettered != 0 {
		bm.Fatalf("stats %+v, want %d processed and nothing else", st, n)
	}
	// The ceiling again, after the worker: their mean cancels a drift of
	// the machine's load during the run.
	ceiling := (ceilingBefore + benchCeiling(bm, ctx, pool, "ceiling-after", n, batch)) / 2
	rate := float64(int64(n)-first) / elapsed.Seconds()
	bm.ReportMetric(rate, "msg/s")
	bm.ReportMetric(ceiling, "ceiling_msg/s")
	bm.ReportMetric(rate/ceiling, "ratio")
}

const benchUpdate = `UPDATE bench_accounts SET balance = balance + 1, version = version + 1 WHERE id = $1`

// benchCeiling runs the worker's statements for n messages straight against
// PostgreSQL: benchConcurrency clients, each owning the messages of one
// partition, batch messages per transaction. It returns messages/s.
func benchCeiling(bm *testing.B, ctx context.Context, pool *pgxpool.Pool, consumer string, n, batch int) float64 {
	q := dbsqlc.New()
	var wg sync.WaitGroup
	errs := make(chan error, benchConcurrency)
	start := time.Now()
	for p := range benchConcurrency {
		wg.Go(func() {
			var ids []int
			for i := p; i < n; i += benchConcurrency {
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
						_, err := tx.Exec(ctx, benchUpdate, i%benchAccounts)
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
						if _, err := tx.Exec(ctx, benchUpdate, i%benchAccounts); err != nil {
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
		bm.Fatal(err)
	}
	return float64(n) / elapsed.Seconds()
}
