package bridge_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/migration/bridge"
	"github.com/ferryhq/ferry/outbox"
)

// The dedupe window against bridged copies. A consumer reads a non-Ferry
// topic on cluster A and its bridged copy on cluster B and applies both
// copies on sight; its inbox keeps the first. A prune between the first
// copy and the second, with a retention below the cross-channel delay,
// forgets the first: the second then takes effect again.

const (
	// dedupeFirst records pass through both channels before the prune,
	// so that the cross-channel delay can be measured by then.
	dedupeFirst = 50
	// dedupeSecond records reach cluster B only after the prune.
	dedupeSecond = 150
	// dedupeRetention is the inbox retention of the prune: below the
	// delay of the second records, whose copies on B wait for the prune.
	dedupeRetention = 200 * time.Millisecond
)

// dedupeRun is what the scenario saw.
type dedupeRun struct {
	consumer string
	pruneErr error
	pruned   int64
	// effects is the number of effect rows of each id: one per
	// application of the record, on either channel.
	effects map[string]int
	// firstDelay is the largest delay between a first record's copy on A
	// and its copy on B; secondDelay the same for the second records.
	firstDelay, secondDelay time.Duration
	// oldCopies and newCopies count the consumer's ferry_inbox_copy rows
	// per side: what the prune's dedupe window is measured from.
	oldCopies, newCopies int64
}

// effectsTable holds one row per application of a record, written in the
// handler's transaction, so that a double effect is a second row.
const effectsTable = `CREATE TABLE dedupe_effect (
    message_id text        NOT NULL,
    topic      text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// startWorker runs an inbox worker for consumer on one cluster, applying
// topic's records into dedupe_effect, until the test ends.
func startWorker(b *bundle, pool *pgxpool.Pool, consumer, topic string, brokers []string) *inbox.Worker {
	b.t.Helper()
	w, err := inbox.New(&inbox.Config{DB: pool, KafkaOpts: []kgo.Opt{kgo.SeedBrokers(brokers...)},
		CommitInterval: 100 * time.Millisecond, RetryBackoff: 50 * time.Millisecond})
	if err != nil {
		b.t.Fatal(err)
	}
	w.Handle(consumer, topic, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO dedupe_effect (message_id, topic) VALUES ($1, $2)`, m.ID, m.Topic)
		return err
	})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("worker on %v: %v", brokers, err)
		}
	})
	return w
}

// queryInt runs a query that returns one number.
func queryInt(b *bundle, pool *pgxpool.Pool, query string, args ...any) int64 {
	b.t.Helper()
	var n int64
	if err := pool.QueryRow(b.ctx, query, args...).Scan(&n); err != nil {
		b.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// idRecords are n records of a producer that is not Ferry's, each with an id
// header of its own.
func idRecords(batch string, n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		id := batch + "-" + strconv.Itoa(i)
		recs[i] = &kgo.Record{Key: []byte("agg-" + strconv.Itoa(i%20)), Value: []byte("value of " + id),
			Headers: []kgo.RecordHeader{{Key: outbox.HeaderID, Value: []byte(id)}}}
	}
	return recs
}

// dedupeScenario runs the scenario, with inbox.Prune, or when unsafe with a
// prune that ignores the dedupe window (a plain DELETE at the retention):
//
//  1. The first records go to cluster A; the consumer applies them there.
//     Then the bridge copies them to B, where the consumer meets them
//     again and its inbox skips them: pairs of copies whose delay the
//     prune's dedupe window can measure.
//  2. The bridge stops. The second records go to A and are applied there.
//  3. Once every inbox row is older than dedupeRetention, a prune runs at
//     that retention (inbox.Prune's safety minimum lowered to it).
//  4. The bridge starts again and copies the second records to B, where
//     the consumer meets them long after the prune.
//
// The consumer is two inbox workers under one consumer name, sharing one
// database: one on A reading the old topic, one on B reading the bridged
// topic. A worker learns the new channel from the fences of Ferry's relay
// on the old topics, and the bridge writes no fences, so a consumer of a
// bridged topic reads cluster B by a configuration of its own.
func dedupeScenario(t *testing.T, unsafe bool) dedupeRun {
	b := setup(t, opts{})
	b.request(migration.DualWrite, 0)
	consumerDB := ferrytest.NewMigratedDB(t) // producer and consumers share no database
	pool := consumerDB.Pool
	if _, err := pool.Exec(b.ctx, effectsTable); err != nil {
		t.Fatal(err)
	}
	run := dedupeRun{consumer: "stock-" + ferrytest.Suffix()}
	onA := startWorker(b, pool, run.consumer, b.oldTopic, ferrytest.Brokers(t))
	onB := startWorker(b, pool, run.consumer, b.newTopic, ferrytest.BrokersB(t))
	effects := func() int64 { return queryInt(b, pool, `SELECT count(*) FROM dedupe_effect`) }
	copiesOnB := func() int64 {
		return queryInt(b, pool, `SELECT count(*) FROM ferry_inbox_copy WHERE consumer = $1 AND side = 'new'`, run.consumer)
	}

	// 1. Both copies of the first records, the second one late.
	b.produce(idRecords("first", dedupeFirst)...)
	b.waitFor("the first records applied from cluster A", func() bool { return effects() == dedupeFirst })
	br := b.start(b.cfg)
	// The worker counts a batch after its transaction commits the copies'
	// rows: wait for both, or the counters may lag the rows.
	b.waitFor("the first records' copies met on cluster B", func() bool {
		return copiesOnB() == dedupeFirst && onB.Stats().Duplicates >= dedupeFirst
	})
	if st := onB.Stats(); st.Duplicates < dedupeFirst || st.Processed != 0 {
		t.Fatalf("the worker on B: %+v, want the %d first copies skipped as duplicates, none applied", st, dedupeFirst)
	}

	// 2. The bridge stops, having committed the first records on A, so
	// that its restart copies the second ones only.
	if err := br.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := b.committed(bridge.GroupPrefix + b.plan); got != dedupeFirst {
		t.Fatalf("the bridge committed %d offsets at its stop, want %d", got, dedupeFirst)
	}
	b.produce(idRecords("second", dedupeSecond)...)
	b.waitFor("the second records applied from cluster A", func() bool { return effects() == dedupeFirst+dedupeSecond })

	// 3. The prune, between the second records' two copies.
	b.waitFor("every inbox row older than the retention", func() bool {
		return queryInt(b, pool, `SELECT count(*) FROM inbox WHERE consumer = $1 AND processed_at < now() - $2::interval`,
			run.consumer, dedupeRetention.String()) == dedupeFirst+dedupeSecond
	})
	run.oldCopies = queryInt(b, pool, `SELECT count(*) FROM ferry_inbox_copy WHERE consumer = $1 AND side = 'old'`, run.consumer)
	run.newCopies = copiesOnB()
	if unsafe {
		// A prune that ignores the dedupe window deletes what the
		// retention alone allows: every row older than it.
		tag, err := pool.Exec(b.ctx, `DELETE FROM inbox WHERE consumer = $1 AND processed_at < now() - $2::interval`,
			run.consumer, dedupeRetention.String())
		if err != nil {
			t.Fatal(err)
		}
		run.pruned = tag.RowsAffected()
	} else {
		cfg := &inbox.PruneConfig{InboxRetention: dedupeRetention, InboxRetentionMin: dedupeRetention}
		res, err := inbox.Prune(b.ctx, pool, cfg)
		if res == nil {
			t.Fatalf("prune settings refused: %v", err)
		}
		run.pruneErr, run.pruned = err, res.Deleted
	}

	// 4. The second records' late copies.
	b.start(b.cfg)
	b.waitFor("the second records' copies met on cluster B", func() bool { return copiesOnB() == dedupeFirst+dedupeSecond })
	if st := onA.Stats(); st.Processed != dedupeFirst+dedupeSecond {
		t.Fatalf("the worker on A: %+v, want every record applied once there", st)
	}

	run.effects = map[string]int{}
	rows, err := pool.Query(b.ctx, `SELECT message_id, count(*) FROM dedupe_effect GROUP BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		run.effects[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(run.effects) != dedupeFirst+dedupeSecond {
		t.Fatalf("%d ids have an effect, want %d", len(run.effects), dedupeFirst+dedupeSecond)
	}
	delay := func(batch string) time.Duration {
		var micros int64
		if err := pool.QueryRow(b.ctx, `SELECT coalesce((extract(epoch FROM max(c.received_at - e.applied_at)) * 1000000)::bigint, 0)
			FROM ferry_inbox_copy c JOIN dedupe_effect e ON e.message_id = c.message_id AND e.topic = $2
			WHERE c.consumer = $1 AND c.side = 'new' AND c.message_id LIKE $3`,
			run.consumer, b.oldTopic, batch+"-%").Scan(&micros); err != nil {
			t.Fatal(err)
		}
		return time.Duration(micros) * time.Microsecond
	}
	run.firstDelay, run.secondDelay = delay("first"), delay("second")
	t.Logf("%d + %d records; cross-channel delay of the first %s, of the second %s; retention %s; "+
		"copies recorded before the prune: %d on the old channel, %d on the new; prune deleted %d inbox rows, error: %v",
		dedupeFirst, dedupeSecond, run.firstDelay, run.secondDelay, dedupeRetention,
		run.oldCopies, run.newCopies, run.pruned, run.pruneErr)
	if run.secondDelay <= dedupeRetention {
		t.Fatalf("the second copies came %s after the first, within the retention %s: the scenario proves nothing", run.secondDelay, dedupeRetention)
	}
	return run
}

// doubles returns the ids applied more than once, by batch.
func (r dedupeRun) doubles() map[string]int {
	out := map[string]int{}
	for id, n := range r.effects {
		if n > 1 {
			out[id[:strings.LastIndex(id, "-")]]++
		}
	}
	return out
}

// The negative control: a prune that ignores the dedupe window forgets
// the second records while their copies on B are still to come, and each
// of them takes effect twice. The checker counts those double effects.
func TestDedupeWindowShorterThanTheCrossChannelDelayAppliesTwice(t *testing.T) {
	t.Parallel()
	run := dedupeScenario(t, true)
	if run.pruneErr != nil {
		t.Fatalf("the unsafe prune returned %v, want it to prune regardless of the dedupe window", run.pruneErr)
	}
	if run.pruned != dedupeFirst+dedupeSecond {
		t.Fatalf("the unsafe prune deleted %d inbox rows, want all %d", run.pruned, dedupeFirst+dedupeSecond)
	}
	d := run.doubles()
	if d["second"] != dedupeSecond || d["first"] != 0 {
		t.Fatalf("double effects by batch %v, want each of the %d second records twice (pruned before their copy on B came) and no first one",
			d, dedupeSecond)
	}
}

// The same scenario with the dedupe window checked: the prune refuses the
// consumer, whose measured cross-channel delay needs a retention of an
// hour or more, and keeps its inbox whole; every record has one effect.
func TestDedupeWindowCheckedAgainstTheCrossChannelDelayAppliesOnce(t *testing.T) {
	t.Parallel()
	run := dedupeScenario(t, false)
	var dw *inbox.DedupeWindowError
	if !errors.Is(run.pruneErr, inbox.ErrRetentionTooShort) || !errors.As(run.pruneErr, &dw) || dw.Consumer != run.consumer {
		t.Errorf("prune at %s: %v, want a *DedupeWindowError for consumer %s wrapping ErrRetentionTooShort",
			dedupeRetention, run.pruneErr, run.consumer)
	}
	if run.pruned != 0 {
		t.Errorf("the prune deleted %d inbox rows of the consumer, want none", run.pruned)
	}
	if d := run.doubles(); len(d) > 0 {
		t.Errorf("double effects by batch %v, want every record once", d)
	}
}
