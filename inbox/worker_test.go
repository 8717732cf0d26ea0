package inbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// modes are the processing modes every delivery property must hold in.
var modes = []struct {
	name string
	set  func(*Config)
}{
	{"one_per_transaction", func(c *Config) { c.BatchSize = 1 }},
	{"batched", func(c *Config) { c.BatchSize = 16 }},
	{"per_key", func(c *Config) { c.KeyConcurrency = 4; c.BatchSize = 1 }},
}

// The same message produced five times takes effect once; the other four
// are skipped as duplicates, and all five offsets are committed.
func TestSameMessageFiveTimesHasOneEffect(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			for range 5 {
				b.produce(b.record("m-1", "k", 0, 1))
			}
			b.produce(b.record("m-2", "k", 0, 2))
			cfg := b.config()
			mode.set(cfg)
			w := b.newWorker(cfg, effectHandler)
			b.start(w)

			b.waitCommitted(b.consumer, 0, 6)
			if n := b.effects("m-1"); n != 1 {
				t.Errorf("m-1 has %d effects, want 1", n)
			}
			if n := b.effects("m-2"); n != 1 {
				t.Errorf("m-2 has %d effects, want 1", n)
			}
			st := w.Stats()
			if st.Processed != 2 || st.Duplicates != 4 {
				t.Errorf("stats %+v: want 2 processed, 4 duplicates", st)
			}
			if n := b.count(`SELECT count(*) FROM inbox WHERE consumer = $1`, b.consumer); n != 2 {
				t.Errorf("%d inbox rows, want 2", n)
			}
		})
	}
}

// Two consumers of one topic each apply a message once: the inbox is per
// consumer.
func TestEachConsumerAppliesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(b.record("m-1", "k", 0, 1), b.record("m-1", "k", 0, 1))
	w, err := New(b.config())
	if err != nil {
		t.Fatal(err)
	}
	other := b.consumer + "_other"
	w.Handle(b.consumer, b.topic, effectHandler)
	w.Handle(other, b.topic, effectHandler)
	b.start(w)
	b.waitCommitted(b.consumer, 0, 2)
	b.waitCommitted(other, 0, 2)
	if n := b.count(`SELECT count(*) FROM effects WHERE message_id = 'm-1' AND consumer = $1`, b.consumer); n != 1 {
		t.Errorf("consumer %s: %d effects, want 1", b.consumer, n)
	}
	if n := b.count(`SELECT count(*) FROM effects WHERE message_id = 'm-1' AND consumer = $1`, other); n != 1 {
		t.Errorf("consumer %s: %d effects, want 1", other, n)
	}
}

// A handler that fails twice and then succeeds has one effect, made on the
// third attempt, which the handler sees.
func TestFailsTwiceThenSucceeds(t *testing.T) {
	t.Parallel()
	for _, mode := range modes[:2] {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			b.produce(b.record("m-0", "k0", 0, 0), b.record("m-1", "k", 0, 1), b.record("m-2", "k", 0, 2))
			var calls atomic.Int32
			h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
				if m.ID == "m-1" && m.Attempt < 3 {
					calls.Add(1)
					// The failed attempt's write must roll back with it.
					if err := insertEffect(ctx, tx, m, "failed"); err != nil {
						return err
					}
					return fmt.Errorf("flaky dependency, attempt %d", m.Attempt)
				}
				return insertEffect(ctx, tx, m, "")
			}
			cfg := b.config()
			mode.set(cfg)
			w := b.newWorker(cfg, h)
			b.start(w)

			b.waitCommitted(b.consumer, 0, 3)
			var attempt int
			if err := b.db.Pool.QueryRow(b.ctx, `SELECT attempt FROM effects WHERE message_id = 'm-1'`).Scan(&attempt); err != nil {
				t.Fatalf("m-1 effect: %v (effects: %d)", err, b.effects("m-1"))
			}
			if attempt != 3 {
				t.Errorf("effect made on attempt %d, want 3", attempt)
			}
			if n := b.effects("m-1"); n != 1 {
				t.Errorf("m-1 has %d effects, want 1", n)
			}
			if n := calls.Load(); n != 2 {
				t.Errorf("%d failed calls, want 2", n)
			}
			// m-2 shares m-1's key: it must take effect after m-1.
			if n := b.count(`SELECT count(*) FROM effects a JOIN effects b ON a.key = b.key AND a.seq < b.seq AND a.n > b.n`); n != 0 {
				t.Errorf("%d effects out of key order", n)
			}
			if st := w.Stats(); st.Retries != 2 || st.DeadLettered != 0 {
				t.Errorf("stats %+v: want 2 retries, nothing dead-lettered", st)
			}
		})
	}
}

// A permanent error, an exhausted retry budget, a record without id and an
// undecodable payload each produce a dead letter with every context header
// at once; the partition's other messages are applied and its offset moves
// past all of them.
func TestFailuresGoToTheDeadLetterTopic(t *testing.T) {
	t.Parallel()
	for _, mode := range modes[:2] {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 2)
			noID := b.record("", "k-noid", 0, 3)
			noID.Headers = noID.Headers[1:]
			bad := b.record("m-bad", "k-bad", 0, 4)
			bad.Value = []byte("not a number")
			b.produce(
				b.record("m-1", "k1", 0, 1),
				b.record("m-perm", "k-perm", 0, 2),
				noID,
				bad,
				b.record("m-flaky", "k-flaky", 0, 5),
				b.record("m-6", "k6", 0, 6),
				b.record("m-p1", "k-p1", 1, 7),
			)
			var permCalls atomic.Int32
			h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
				switch m.ID {
				case "m-perm":
					permCalls.Add(1)
					return Permanent(errors.New("order 42 does not exist"))
				case "m-flaky":
					return errors.New("still down")
				}
				return effectHandler(ctx, tx, m)
			}
			cfg := b.config()
			cfg.MaxAttempts = 3
			mode.set(cfg)
			w := b.newWorker(cfg, h)
			b.start(w)

			b.waitCommitted(b.consumer, 0, 6)
			b.waitCommitted(b.consumer, 1, 1)
			for _, id := range []string{"m-1", "m-6", "m-p1"} {
				if n := b.effects(id); n != 1 {
					t.Errorf("%s has %d effects, want 1", id, n)
				}
			}
			if n := permCalls.Load(); n != 1 {
				t.Errorf("permanent failure called the handler %d times, want 1", n)
			}
			dls := b.deadLetters()
			want := map[string]struct {
				reason   DeadLetterReason
				offset   int64
				attempts int
				errText  string
			}{
				"m-perm":  {ReasonPermanent, 1, 1, "order 42 does not exist"},
				"":        {ReasonMissingID, 2, 0, `record has no "id" header`},
				"m-bad":   {ReasonUndecodable, 3, 1, `payload "not a number" is not a number`},
				"m-flaky": {ReasonRetriesExhausted, 4, 3, "still down"},
			}
			if len(dls) != len(want) {
				t.Fatalf("%d dead letters, want %d: %+v", len(dls), len(want), dls)
			}
			for _, d := range dls {
				w, ok := want[d.ID]
				if !ok {
					t.Errorf("unexpected dead letter %+v", d)
					continue
				}
				if d.Reason != w.reason || d.OriginalOffset != w.offset || d.Attempts != w.attempts || d.Error != w.errText {
					t.Errorf("dead letter of %q: reason %q offset %d attempts %d error %q; want %q %d %d %q",
						d.ID, d.Reason, d.OriginalOffset, d.Attempts, d.Error, w.reason, w.offset, w.attempts, w.errText)
				}
				if d.OriginalTopic != b.topic || d.OriginalPartition != 0 || d.Consumer != b.consumer {
					t.Errorf("dead letter of %q: from %s/%d by %q, want %s/0 by %q", d.ID, d.OriginalTopic, d.OriginalPartition, d.Consumer, b.topic, b.consumer)
				}
				if d.OriginalTimestamp.IsZero() || time.Since(d.OriginalTimestamp) > time.Hour {
					t.Errorf("dead letter of %q: original timestamp %v", d.ID, d.OriginalTimestamp)
				}
				if d.FailedAt.Before(d.OriginalTimestamp) || time.Since(d.FailedAt) > time.Hour {
					t.Errorf("dead letter of %q: failed at %v, original timestamp %v", d.ID, d.FailedAt, d.OriginalTimestamp)
				}
			}
			// The original record travels intact: key, value, headers.
			for _, d := range dls {
				if d.ID != "m-bad" {
					continue
				}
				if string(d.Key) != "k-bad" || string(d.Value) != "not a number" {
					t.Errorf("dead letter key/value %q/%q, want the original", d.Key, d.Value)
				}
				got := map[string]string{}
				for _, h := range d.Headers {
					got[h.Key] = string(h.Value)
				}
				if got[outbox.HeaderID] != "m-bad" || got["content-type"] != "text/plain" || got[outbox.HeaderEventType] != "Tested" || len(got) != 5 {
					t.Errorf("dead letter keeps headers %v, want the original five", got)
				}
			}
			// Every header is on the record itself.
			raw := ferrytest.Client(t, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{b.dlq: {0: kgo.NewOffset().AtStart()}}))
			var r *kgo.Record
			for r == nil {
				fetches := raw.PollFetches(b.ctx)
				if err := b.ctx.Err(); err != nil {
					t.Fatal(err)
				}
				if recs := fetches.Records(); len(recs) > 0 {
					r = recs[0]
				}
			}
			for _, k := range []string{HeaderDeadLetterReason, HeaderDeadLetterError, HeaderDeadLetterAttempts, HeaderDeadLetterOriginalTopic,
				HeaderDeadLetterOriginalPartition, HeaderDeadLetterOriginalOffset, HeaderDeadLetterOriginalTimestamp,
				HeaderDeadLetterConsumer, HeaderDeadLetterFailedAt} {
				found := false
				for _, h := range r.Headers {
					found = found || h.Key == k
				}
				if !found {
					t.Errorf("dead letter lacks header %s", k)
				}
			}
			if st := w.Stats(); st.DeadLettered != 4 {
				t.Errorf("stats %+v: want 4 dead-lettered", st)
			}
		})
	}
}

// With a savepoint per message, one failing message in a batch neither
// undoes nor blocks the others: they commit, the failure is retried after
// the batch, and the later message of its key still comes after it.
func TestBatchFailureIsolatedBySavepoint(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var recs []*kgo.Record
	for i := range 20 {
		recs = append(recs, b.record("m-"+strconv.Itoa(i), "k"+strconv.Itoa(i%5), 0, i))
	}
	b.produce(recs...)
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-6" && m.Attempt == 1 {
			// Break the transaction the way a real failure does: the
			// savepoint must recover it.
			_, _ = tx.Exec(ctx, `SELECT 1/0`)
			return errors.New("transient")
		}
		return effectHandler(ctx, tx, m)
	}
	cfg := b.config()
	cfg.BatchSize = 20
	cfg.RetryBackoff, cfg.RetryBackoffMax = 200*time.Millisecond, 200*time.Millisecond
	w := b.newWorker(cfg, h)
	b.start(w)
	b.waitCommitted(b.consumer, 0, 20)

	if n := b.count(`SELECT count(*) FROM effects`); n != 20 {
		t.Errorf("%d effects, want 20", n)
	}
	if n := b.count(`SELECT count(DISTINCT message_id) FROM effects`); n != 20 {
		t.Errorf("%d distinct messages applied, want 20", n)
	}
	// m-7 (key k2) and the other keys committed in the batch, before the
	// retry of m-6 (key k1); m-11 and m-16 (key k1) came after m-6.
	var n6, n7, n11 int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT
		(SELECT n FROM effects WHERE message_id = 'm-6'),
		(SELECT n FROM effects WHERE message_id = 'm-7'),
		(SELECT n FROM effects WHERE message_id = 'm-11')`).Scan(&n6, &n7, &n11); err != nil {
		t.Fatal(err)
	}
	if n7 > n6 {
		t.Errorf("m-7 (another key) applied after the retry of m-6: the failure blocked the batch")
	}
	if n11 < n6 {
		t.Errorf("m-11 applied before m-6: key order broken")
	}
	if n := b.count(`SELECT count(*) FROM effects a JOIN effects b ON a.key = b.key AND a.seq < b.seq AND a.n > b.n`); n != 0 {
		t.Errorf("%d effects out of key order", n)
	}
	if st := w.Stats(); st.Retries != 1 || st.Processed != 20 {
		t.Errorf("stats %+v: want 1 retry, 20 processed", st)
	}
}

func laneOfKey(key string, lanes int) uint32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return h.Sum32() % uint32(lanes)
}

// With per-key concurrency, other keys overtake a slow one, but the
// committed offset never passes the lowest unfinished message.
func TestKeyConcurrencyCommitsBelowTheLowestUnfinished(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	slow, fast := "slow", "fast"
	for laneOfKey(fast, 2) == laneOfKey(slow, 2) {
		fast += "x"
	}
	recs := []*kgo.Record{b.record("m-slow", slow, 0, 0)}
	for i := 1; i <= 5; i++ {
		recs = append(recs, b.record("m-fast-"+strconv.Itoa(i), fast, 0, i))
	}
	b.produce(recs...)
	release := make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-slow" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return effectHandler(ctx, tx, m)
	}
	cfg := b.config()
	cfg.KeyConcurrency = 2
	w := b.newWorker(cfg, h)
	b.start(w)

	b.waitFor("the fast key's five effects", func() (bool, error) {
		return b.count(`SELECT count(*) FROM effects WHERE key = $1`, fast) == 5, nil
	})
	// Several commit intervals pass; none may commit past offset 0.
	time.Sleep(20 * cfg.CommitInterval)
	if got := b.committed(b.consumer, 0); got > 0 {
		t.Fatalf("committed offset %d while offset 0 is unfinished", got)
	}
	close(release)
	b.waitCommitted(b.consumer, 0, 6)
	if n := b.effects("m-slow"); n != 1 {
		t.Errorf("m-slow has %d effects, want 1", n)
	}
}

// A retry backoff wakes at once when its partition is revoked, and the
// member that waits is never kicked out of the group: it keeps heartbeating
// past the session timeout, gives the revoked partition to the joining
// member, and its other wait ends when it shuts down.
func TestBackoffWakesOnRevokeAndMemberStays(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.produce(b.record("m-0", "k0", 0, 0), b.record("m-1", "k1", 1, 1))
	groupOpts := []kgo.Opt{
		kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(500 * time.Millisecond),
		// A member that held a rebalance this long would be kicked out.
		kgo.RebalanceTimeout(10 * time.Second),
	}
	var failing atomic.Int32
	cfgA := b.config()
	cfgA.KafkaOpts = append(cfgA.KafkaOpts, groupOpts...)
	cfgA.RetryBackoff, cfgA.RetryBackoffMax = 10*time.Minute, 10*time.Minute
	cfgA.MaxAttempts = 100
	// Longer than the rebalance timeout: only the backoff waking up can
	// let the revoke finish in time.
	cfgA.DrainTimeout = time.Minute
	a := b.newWorker(cfgA, func(context.Context, pgx.Tx, *Message) error {
		failing.Add(1)
		return errors.New("dependency down")
	})
	stopA := b.start(a)
	b.waitFor("both partitions to fail once on A", func() (bool, error) { return failing.Load() == 2, nil })
	memberA := memberID(a)

	// Wait past the session timeout while both partitions sleep.
	time.Sleep(8 * time.Second)
	adm := ferrytest.Admin(t)
	if ms := groupMembers(t, b.ctx, adm, b.consumer); len(ms) != 1 || ms[0] != memberA {
		t.Fatalf("group members %v, want only A (%s)", ms, memberA)
	}

	cfgB := b.config()
	cfgB.KafkaOpts = append(cfgB.KafkaOpts, groupOpts...)
	bw := b.newWorker(cfgB, func(ctx context.Context, tx pgx.Tx, m *Message) error { return insertEffect(ctx, tx, m, "B") })
	b.start(bw)
	b.waitFor("B to apply the partition A gave up", func() (bool, error) {
		return b.count(`SELECT count(*) FROM effects WHERE worker = 'B'`) == 1, nil
	})
	st := a.Stats()
	if st.PartitionsRevoked != 1 || st.BackoffsInterrupted < 1 || st.PartitionsLost != 0 {
		t.Errorf("A's stats %+v: want 1 revoked, an interrupted backoff, nothing lost", st)
	}
	if got := memberID(a); got != memberA {
		t.Errorf("A's member id changed from %s to %s: it was kicked out", memberA, got)
	}
	if ms := groupMembers(t, b.ctx, adm, b.consumer); len(ms) != 2 {
		t.Errorf("group members %v, want A and B", ms)
	}

	// Shutdown wakes A's other backoff; the partition moves to B.
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	b.waitFor("B to apply both", func() (bool, error) {
		return b.count(`SELECT count(*) FROM effects WHERE worker = 'B'`) == 2, nil
	})
	if n := b.count(`SELECT count(*) FROM effects`); n != 2 {
		t.Errorf("%d effects, want 2", n)
	}
}

func memberID(w *Worker) string {
	gs := w.groups.Load()
	if gs == nil || len(*gs) == 0 {
		return ""
	}
	id, _ := (*gs)[0].kafka().GroupMetadata()
	return id
}

func groupMembers(t *testing.T, ctx context.Context, adm *kadm.Client, group string) []string {
	t.Helper()
	gs, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range gs[group].Members {
		out = append(out, m.MemberID)
	}
	return out
}

// Shutdown lets the transaction in flight finish and commits its offset.
func TestShutdownDrainsAndCommits(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(b.record("m-1", "k", 0, 1), b.record("m-2", "k", 0, 2))
	inHandler := make(chan struct{})
	release := make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-1" {
			close(inHandler)
			<-release
		}
		return effectHandler(ctx, tx, m)
	}
	cfg := b.config()
	cfg.CommitInterval = time.Hour // only the shutdown commits
	cfg.BatchSize = 1              // m-2 is a transaction of its own, not started once draining
	draining := make(chan struct{})
	cfg.hooks.stopped = func() { close(draining) }
	w := b.newWorker(cfg, h)
	stop := b.start(w)
	<-inHandler
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	<-draining // the partition takes no new message from here on
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if n := b.effects("m-1"); n != 1 {
		t.Errorf("m-1 has %d effects, want 1", n)
	}
	if n := b.effects("m-2"); n != 0 {
		t.Errorf("m-2 has %d effects: shutdown must not start new messages", n)
	}
	if got := b.committed(b.consumer, 0); got != 1 {
		t.Errorf("committed offset %d after shutdown, want 1", got)
	}
}

// A dead letter that cannot be written is retried, and the message's offset
// is committed only once Kafka acknowledged it.
func TestDeadLetterWriteRetriedUntilAcknowledged(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	missing := b.topic + ".missing-dlq"
	b.produce(b.record("m-1", "k", 0, 1), b.record("m-2", "k", 0, 2))
	cfg := b.config()
	cfg.DeadLetterTopic = func(string) string { return missing }
	w := b.newWorker(cfg, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-1" {
			return Permanent(errors.New("broken"))
		}
		return effectHandler(ctx, tx, m)
	})
	b.start(w)
	b.waitFor("a failed dead-letter write", func() (bool, error) { return w.Stats().DeadLetterErrors >= 1, nil })
	// The partition cannot move, and readiness says so by name.
	b.waitFor("readiness to report the stuck partition", func() (bool, error) {
		err := w.Ready()
		return err != nil && strings.Contains(err.Error(), "cannot move") && strings.Contains(err.Error(), missing), nil
	})
	if got := b.committed(b.consumer, 0); got > 0 {
		t.Fatalf("offset %d committed without the dead letter", got)
	}
	if n := b.effects("m-2"); n != 0 {
		t.Fatalf("m-2 applied while m-1's dead letter is pending: order broken")
	}
	ferrytest.CreateTopic(t, missing, 1)
	b.waitCommitted(b.consumer, 0, 2)
	b.waitFor("readiness once the dead letter is written", func() (bool, error) { return w.Ready() == nil, nil })
	dls, err := ListDeadLetters(b.ctx, b.kopts, missing, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].ID != "m-1" || dls[0].Reason != ReasonPermanent {
		t.Errorf("dead letters %+v, want m-1 once", dls)
	}
	if n := b.effects("m-2"); n != 1 {
		t.Errorf("m-2 has %d effects, want 1", n)
	}
}

// Run refuses to start without the inbox table, rather than retrying a
// missing table forever.
func TestRunNeedsTheInboxTable(t *testing.T) {
	t.Parallel()
	db := ferrytest.NewDB(t)
	w, err := New(&Config{DB: db.Pool, KafkaOpts: []kgo.Opt{kgo.SeedBrokers(ferrytest.Brokers(t)...)}})
	if err != nil {
		t.Fatal(err)
	}
	w.Handle("c", "t", effectHandler)
	if err := w.Run(ferrytest.Context(t, time.Minute)); !errors.Is(err, ErrInboxMissing) {
		t.Fatalf("Run: %v, want ErrInboxMissing", err)
	}
}

// A transaction still running at the drain timeout is cancelled: it rolls
// back, its offset is not committed, and the message comes again. A handler
// that even ignores cancellation cannot hold shutdown (or a rebalance)
// either.
func TestDrainTimeoutCancelsThenAbandons(t *testing.T) {
	t.Parallel()
	for _, ignoresCtx := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignores_ctx=%v", ignoresCtx), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			b.produce(b.record("m-1", "k", 0, 1))
			entered := make(chan struct{})
			unblock := make(chan struct{})
			var unblockOnce sync.Once
			release := func() { unblockOnce.Do(func() { close(unblock) }) }
			defer release()
			first := true
			h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
				if first {
					first = false
					if err := insertEffect(ctx, tx, m, "stuck"); err != nil {
						return err
					}
					close(entered)
					if ignoresCtx {
						<-unblock
						return nil
					}
					<-ctx.Done()
					return ctx.Err()
				}
				return insertEffect(ctx, tx, m, "")
			}
			cfg := b.config()
			cfg.DrainTimeout = 200 * time.Millisecond
			w := b.newWorker(cfg, h)
			stop := b.start(w)
			<-entered
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got := b.committed(b.consumer, 0); got >= 1 {
				t.Fatalf("offset %d committed for a cancelled message", got)
			}
			if !ignoresCtx {
				if n := b.effects("m-1"); n != 0 {
					t.Fatalf("the cancelled transaction left %d effects", n)
				}
			}
			again := b.newWorker(b.config(), effectHandler)
			b.start(again)
			// The abandoned transaction still holds m-1's inbox row: the
			// next worker waits for it rather than applying m-1 twice. The
			// stuck handler returns late, its commit fails on the cancelled
			// context, and the row is free.
			release()
			b.waitCommitted(b.consumer, 0, 1)
			if n := b.count(`SELECT count(*) FROM effects WHERE message_id = 'm-1' AND worker = ''`); n != 1 {
				t.Errorf("m-1 applied %d times on redelivery, want 1", n)
			}
			if n := b.effects("m-1"); n != 1 {
				t.Errorf("m-1 has %d effects, want 1", n)
			}
		})
	}
}

// flakyDB fails Begin the way a restarting PostgreSQL does, following a
// script: true fails the call, false lets it through; after the script,
// every call goes through.
type flakyDB struct {
	outbox.Beginner
	mu     sync.Mutex
	script []bool
}

func (f *flakyDB) Begin(ctx context.Context) (pgx.Tx, error) {
	f.mu.Lock()
	fail := len(f.script) > 0 && f.script[0]
	if len(f.script) > 0 {
		f.script = f.script[1:]
	}
	f.mu.Unlock()
	if fail {
		return nil, &pgconn.PgError{Code: pgerrcode.CannotConnectNow, Message: "the database system is starting up"}
	}
	return f.Beginner.Begin(ctx)
}

// An unreachable database is never the message's fault: with a budget of
// one attempt, failures to begin are retried until the database is back,
// and nothing is dead-lettered. Run also waits for the database at start.
func TestDatabaseFailuresNeverDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(b.record("m-1", "k", 0, 1))
	// Two failures at start, the schema check, four failures applying m-1.
	db := &flakyDB{Beginner: b.db.Pool, script: []bool{true, true, false, true, true, true, true}}
	cfg := b.config()
	cfg.DB = db
	cfg.MaxAttempts = 1
	w := b.newWorker(cfg, effectHandler)
	b.start(w)
	b.waitCommitted(b.consumer, 0, 1)
	if n := b.effects("m-1"); n != 1 {
		t.Errorf("m-1 has %d effects, want 1", n)
	}
	st := w.Stats()
	if st.DeadLettered != 0 || st.DatabaseErrors != 4 || st.Retries != 0 {
		t.Errorf("stats %+v: want 4 database errors, no retry counted, nothing dead-lettered", st)
	}
}

// A partition that holds its byte budget pauses its fetching, which drops
// what the client fetched beyond it; that is fetched again, so nothing is
// skipped and the order holds.
func TestBackpressurePausesWithoutSkipping(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	// More than one poll returns (pollRecordsMax), so that a pause drops
	// records the client already fetched.
	const total = 3 * pollRecordsMax
	var recs []*kgo.Record
	for i := range total {
		recs = append(recs, b.record(fmt.Sprintf("m-%05d", i), "k", 0, i))
	}
	b.produce(recs...)
	cfg := b.config()
	cfg.BatchSize = 50
	cfg.MaxBufferedBytesPerPartition = 2 << 10 // about ten records
	w := b.newWorker(cfg, effectHandler)
	b.start(w)
	b.waitCommitted(b.consumer, 0, total)
	if n := b.count(`SELECT count(DISTINCT message_id) FROM effects`); n != total {
		t.Errorf("%d messages applied, want %d", n, total)
	}
	if n := b.count(`SELECT count(*) FROM (SELECT seq, lag(seq) OVER (ORDER BY n) AS prev FROM effects) s WHERE prev IS NOT NULL AND seq <> prev + 1`); n != 0 {
		t.Errorf("%d effects out of offset order", n)
	}
	if st := w.Stats(); st.FetchPauses < 2 || st.Duplicates != 0 {
		t.Errorf("stats %+v: want several pauses and no duplicate", st)
	}
}
