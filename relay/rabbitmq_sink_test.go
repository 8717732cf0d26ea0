package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// rabbitSetup is setup for a relay that publishes to the stack's RabbitMQ
// as its administrator user: topics outbox.<suffix>.<aggregate type>.
func rabbitSetup(t testing.TB) *bundle {
	t.Helper()
	b := setup(t)
	b.prefix = "outbox." + ferrytest.Suffix()
	b.cfg.TopicTemplate = b.prefix + ".{aggregate_type}"
	b.cfg.KafkaOpts = nil
	b.cfg.RabbitMQ = &relay.RabbitMQConfig{
		URL:      need(t, ferrytest.EnvRabbitMQURL),
		Password: need(t, ferrytest.EnvRabbitMQPassword),
	}
	return b
}

func need(t testing.TB, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		t.Fatalf("%s is not set: run `eval \"$(scripts/stack up)\"` first", env)
	}
	return v
}

// rabbitAdmin is an administrator's channel on the stack's node, for
// declaring and inspecting the topology.
func rabbitAdmin(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(ferrytest.RabbitMQURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// declare declares the topology of consumer "test" for the topics.
func declare(t testing.TB, topics ...string) {
	t.Helper()
	ch, err := rabbitAdmin(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := rabbitmq.Declare(ch, &rabbitmq.Topology{Consumer: "test", Topics: topics, Shards: rabbitmq.ShardsDefault}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteTopology(t, "test", true, topics...) })
}

// deleteTopology deletes consumer's shard queues of topics and, with
// exchanges, the topics' exchanges and dead-letter stream.
func deleteTopology(t testing.TB, consumer string, exchanges bool, topics ...string) {
	conn, err := amqp.Dial(ferrytest.RabbitMQURL(t))
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, topic := range topics {
		for s := range rabbitmq.ShardsDefault {
			_, _ = ch.QueueDelete(rabbitmq.QueueName(topic, s, consumer), false, false, false)
		}
		if exchanges {
			_, _ = ch.QueueDelete(topic+rabbitmq.DeadLetterStreamSuffix, false, false, false)
			_ = ch.ExchangeDelete(topic, false, false)
			_ = ch.ExchangeDelete(topic+rabbitmq.DeadLetterExchangeSuffix, false, false)
		}
	}
}

// rabbitConsumer reads every shard queue of consumer "test" of topics,
// acknowledging as it goes.
type rabbitConsumer struct {
	mu      sync.Mutex
	records []*kgo.Record
	byID    map[string]int
}

func consumeRabbit(t *testing.T, topics ...string) *rabbitConsumer {
	t.Helper()
	c := &rabbitConsumer{byID: map[string]int{}}
	conn := rabbitAdmin(t)
	for _, topic := range topics {
		for s := range rabbitmq.ShardsDefault {
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			ds, err := ch.Consume(rabbitmq.QueueName(topic, s, "test"), "", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				for d := range ds {
					rec := rabbitmq.Record(&d, topic, s)
					c.mu.Lock()
					c.records = append(c.records, rec)
					c.byID[header(rec, outbox.HeaderID)]++
					c.mu.Unlock()
					_ = d.Ack(false)
				}
			}()
		}
	}
	return c
}

// wait waits until every id of want arrived, then settle more, and returns
// what arrived as a consumed.
func (c *rabbitConsumer) wait(t *testing.T, want []string, timeout, settle time.Duration) *consumed {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		missing := 0
		var example string
		for _, id := range want {
			if c.byID[id] == 0 {
				missing++
				example = id
			}
		}
		c.mu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, %d of %d events never reached RabbitMQ (e.g. %s)", timeout, missing, len(want), example)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(settle)
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &consumed{byID: map[string]int{}}
	out.records = append(out.records, c.records...)
	for k, v := range c.byID {
		out.byID[k] = v
	}
	return out
}

func (c *rabbitConsumer) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byID[id]
}

// slotConfirmedLSN is the slot's confirmed_flush_lsn.
func (b *bundle) slotConfirmedLSN(t *testing.T) pglogrepl.LSN {
	t.Helper()
	st, err := relay.Status(b.ctx, b.db.Pool, b.slot)
	if err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(st.ConfirmedFlushLSN)
	if err != nil {
		t.Fatalf("confirmed_flush_lsn %q: %v", st.ConfirmedFlushLSN, err)
	}
	return lsn
}

// waitStatusUpdates waits until the walsender of the bundle's slot got n
// more status updates from the relay (pg_stat_replication.reply_time moved
// n times). A window that must show nothing happening (no confirmation, no
// new session) is measured in the relay's own reports this way: a loaded
// machine stretches it instead of cutting it short.
func (b *bundle) waitStatusUpdates(t *testing.T, n int) {
	t.Helper()
	var last time.Time
	seen := -1 // the first reading is the update before the window
	deadline := time.Now().Add(time.Minute)
	for seen < n {
		var at *time.Time
		err := b.db.Pool.QueryRow(b.ctx, `
			SELECT r.reply_time FROM pg_stat_replication r
			JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`, b.slot).Scan(&at)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if at != nil && !at.Equal(last) {
			last = *at
			seen++
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay sent %d of %d status updates in a minute", max(seen, 0), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// currentLSN is the server's current WAL position.
func (b *bundle) currentLSN(t *testing.T) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// writeAggregates writes n events for each of aggs aggregates of aggType,
// in transactions of up to 7 events, seq increasing per aggregate from
// from.
func (b *bundle) writeAggregates(t *testing.T, aggType string, aggs, from, n int) []string {
	t.Helper()
	var ids []string
	var batch []outbox.Event
	for seq := from; seq < from+n; seq++ {
		for a := range aggs {
			batch = append(batch, evt(aggType, fmt.Sprintf("agg-%d", a), seq))
			if len(batch) == 7 {
				ids = append(ids, b.write(t, batch...)...)
				batch = nil
			}
		}
	}
	if len(batch) > 0 {
		ids = append(ids, b.write(t, batch...)...)
	}
	return ids
}

// Events written with outbox.Write reach every shard queue of a declared
// topology, each once, in per-aggregate order, and the slot confirms them.
func TestRabbitMQPublishesInOrderBehindConfirms(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	c := consumeRabbit(t, topic)
	r := b.start(t, b.cfg)
	before := b.slotConfirmedLSN(t)

	ids := b.writeAggregates(t, "order", 40, 0, 50)
	got := c.wait(t, ids, time.Minute, 500*time.Millisecond)
	if n := got.duplicates(); n != 0 {
		t.Errorf("%d duplicates without a fault", n)
	}
	got.checkFirstArrivalOrder(t)
	shards := map[int32]bool{}
	for _, rec := range got.records {
		shards[rec.Partition] = true
		if rec.Topic != topic {
			t.Fatalf("record of topic %s", rec.Topic)
		}
	}
	if len(shards) < 8 {
		t.Errorf("40 aggregates landed in %d shard queues only", len(shards))
	}
	b.waitConfirmed(t, 30*time.Second)
	if after := b.slotConfirmedLSN(t); after <= before {
		t.Errorf("confirmed_flush_lsn %s after every confirm, want past %s", after, before)
	}
	if err := r.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
	if st := r.Stats(); st.Published != int64(len(ids)) || st.Sessions != 1 {
		t.Errorf("stats %+v, want %d published in 1 session", st, len(ids))
	}
}

// An event of an exchange no queue is bound to is returned: the relay
// holds it (Ready says why) and loses nothing when the queues are
// declared within Config.UnknownTopicWait; past it, it is quarantined as
// unroutable, and a requeue publishes it.
func TestRabbitMQUnroutableIsHeldThenQuarantined(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	late := b.prefix + ".late"   // queues declared within the wait
	never := b.prefix + ".never" // queues declared after it
	flowing := b.prefix + ".flow"
	admin, err := rabbitAdmin(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{late, never} {
		if err := rabbitmq.DeclareExchange(admin, topic, ""); err != nil {
			t.Fatal(err)
		}
	}
	declare(t, flowing)
	cfg := b.cfg
	cfg.UnknownTopicWait = 6 * time.Second
	r := b.start(t, cfg)
	flow := consumeRabbit(t, flowing)

	lateIDs := b.writeAggregates(t, "late", 3, 0, 4)
	neverIDs := b.write(t, evt("never", "n", 0), evt("never", "n", 1))
	flowIDs := b.writeAggregates(t, "flow", 3, 0, 4)
	flow.wait(t, flowIDs, 30*time.Second, 0)

	deadline := time.Now().Add(10 * time.Second)
	for {
		err := r.Ready()
		if err != nil && strings.Contains(err.Error(), late) && strings.Contains(err.Error(), "unroutable") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v, want it to name %s as unroutable", err, late)
		}
		time.Sleep(50 * time.Millisecond)
	}
	declare(t, late)
	got := consumeRabbit(t, late).wait(t, lateIDs, 30*time.Second, 300*time.Millisecond)
	got.checkFirstArrivalOrder(t)

	// never stays unbound: quarantined as unroutable, nothing confirmed
	// past it meanwhile.
	var q []relay.QuarantinedEvent
	deadline = time.Now().Add(30 * time.Second)
	for len(q) < len(neverIDs) {
		if time.Now().After(deadline) {
			t.Fatalf("quarantined %v, want the 2 events of %s", q, never)
		}
		time.Sleep(100 * time.Millisecond)
		if q, err = relay.ListQuarantined(b.ctx, b.db.Pool, 10); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range q {
		if e.Reason != relay.ReasonUnroutable || e.Topic != never || !strings.Contains(e.Error, "worker schema") {
			t.Errorf("quarantined %s of %s with reason %s: %s", e.ID, e.Topic, e.Reason, e.Error)
		}
	}
	if st := r.Stats(); st.Sessions != 1 {
		t.Errorf("%d sessions: a return must not fail the session", st.Sessions)
	}

	declare(t, never)
	if _, err := relay.Requeue(b.ctx, b.db.Pool, []uuid.UUID{q[0].ID, q[1].ID}); err != nil {
		t.Fatal(err)
	}
	b.waitConfirmed(t, 30*time.Second)
	if n := drainRabbit(t, never).missing(neverIDs); n != 0 {
		t.Fatalf("%d of the %d requeued events did not reach the queues declared since", n, len(neverIDs))
	}
}

// A missing exchange is held like a missing Kafka topic, probed on a
// channel of its own: no publishing channel closes, so the session never
// restarts, and the other topics flow.
func TestRabbitMQMissingExchangeIsHeldWithoutALoop(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	missing := b.prefix + ".missing"
	flowing := b.prefix + ".flow"
	declare(t, flowing)
	cfg := b.cfg
	cfg.UnknownTopicWait = time.Minute
	r := b.start(t, cfg)
	flow := consumeRabbit(t, flowing)

	var flowIDs []string
	held := b.write(t, evt("missing", "m", 0))
	for i := range 20 {
		ids := b.write(t, evt("flow", "f", i), evt("missing", "m", i+1))
		flowIDs, held = append(flowIDs, ids[0]), append(held, ids[1])
	}
	flow.wait(t, flowIDs, 30*time.Second, 0)
	b.waitStatusUpdates(t, 3) // a loop would restart sessions meanwhile
	err := r.Ready()
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "exchange does not exist") {
		t.Errorf("Ready = %v, want it to name the missing exchange %s", err, missing)
	}
	if st := r.Stats(); st.Sessions != 1 {
		t.Errorf("%d sessions while an exchange is missing, want 1", st.Sessions)
	}
	declare(t, missing)
	got := consumeRabbit(t, missing).wait(t, held, 30*time.Second, 300*time.Millisecond)
	got.checkFirstArrivalOrder(t)
	if st := r.Stats(); st.Sessions != 1 {
		t.Errorf("%d sessions, want 1", st.Sessions)
	}
}

// Records RabbitMQ could never take are quarantined before they are sent
// (a message over max_message_size, a header name over 255 bytes would
// close the channel); the others flow in the same session.
func TestRabbitMQOversizedRecordsAreQuarantinedBeforeSending(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	cfg := b.cfg
	rc := *cfg.RabbitMQ
	rc.MaxMessageBytes = 64 << 10
	cfg.RabbitMQ = &rc
	r := b.start(t, cfg)
	c := consumeRabbit(t, topic)

	big := evt("order", "a", 1)
	big.Payload = []byte(`"` + strings.Repeat("x", 70<<10) + `"`)
	long := evt("order", "a", 2)
	long.Headers = map[string]string{strings.Repeat("h", 256): "v"}
	ok := b.write(t, evt("order", "a", 0), big, long, evt("order", "a", 3))
	c.wait(t, []string{ok[0], ok[3]}, 30*time.Second, 300*time.Millisecond)
	if c.count(ok[1]) != 0 || c.count(ok[2]) != 0 {
		t.Fatal("a record over the limits reached RabbitMQ")
	}
	q, err := relay.ListQuarantined(b.ctx, b.db.Pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]relay.QuarantineReason{}
	for _, e := range q {
		reasons[e.ID.String()] = e.Reason
	}
	if reasons[ok[1]] != relay.ReasonMessageTooLarge || reasons[ok[2]] != relay.ReasonInvalidRecord || len(q) != 2 {
		t.Errorf("quarantine %v, want %s message_too_large and %s invalid_record", reasons, ok[1], ok[2])
	}
	if st := r.Stats(); st.Sessions != 1 {
		t.Errorf("%d sessions, want 1", st.Sessions)
	}
}

// TLS with the stack's CA, as the least-privilege relay user (write on
// outbox.* only, no configure, no read): events flow end to end.
func TestRabbitMQOverTLSAsTheRelayUser(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	u, err := url.Parse(need(t, ferrytest.EnvRabbitMQTLSURL))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(need(t, ferrytest.EnvRabbitMQRelayUser))
	cfg := b.cfg
	cfg.RabbitMQ = &relay.RabbitMQConfig{
		URL:       u.String(),
		Password:  need(t, ferrytest.EnvRabbitMQRelayPassword),
		TLSCAFile: need(t, ferrytest.EnvRabbitMQCAFile),
		Channels:  3,
	}
	r := b.start(t, cfg)
	c := consumeRabbit(t, topic)
	ids := b.writeAggregates(t, "order", 10, 0, 10)
	got := c.wait(t, ids, time.Minute, 300*time.Millisecond)
	got.checkFirstArrivalOrder(t)
	if err := r.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
}

// The relay user may write to outbox.* only: an exchange outside it is
// refused by the probe and held in place (Ready says so), with no session
// restart, while the permitted topics flow.
func TestRabbitMQAccessRefusedIsHeldInPlace(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	allowed := b.prefix + ".order"
	denied := "denied." + ferrytest.Suffix() + ".order"
	declare(t, allowed, denied)
	u, err := url.Parse(need(t, ferrytest.EnvRabbitMQURL))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(need(t, ferrytest.EnvRabbitMQRelayUser))
	cfg := b.cfg
	cfg.TopicTemplate = "{event_type}"
	cfg.RabbitMQ = &relay.RabbitMQConfig{URL: u.String(), Password: need(t, ferrytest.EnvRabbitMQRelayPassword)}
	cfg.ShutdownTimeout = time.Second // the held record would keep the stop waiting
	r := b.start(t, cfg)
	c := consumeRabbit(t, allowed)
	ev := func(topic string, seq int) outbox.Event {
		e := evt("order", "a", seq)
		e.EventType = topic
		return e
	}
	ids := b.write(t, ev(denied, 0), ev(allowed, 1), ev(allowed, 2))
	c.wait(t, ids[1:], 30*time.Second, 0)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := r.Ready()
		if err != nil && strings.Contains(err.Error(), denied) && strings.Contains(err.Error(), "not authorized") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v, want %s not authorized", err, denied)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := r.Stats(); st.Sessions != 1 {
		t.Errorf("%d sessions, want 1: a refused exchange must be found by the probe", st.Sessions)
	}
}

// drainRabbit reads, on a connection of its own, everything the shard
// queues of consumer "test" of topic hold, in queue order, and empties
// them.
func drainRabbit(t *testing.T, topic string) *consumed {
	t.Helper()
	conn, err := amqp.Dial(ferrytest.RabbitMQURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	c := &consumed{byID: map[string]int{}}
	for s := range rabbitmq.ShardsDefault {
		// basic.get is refused on a single-active-consumer queue: consume
		// as many as the queue holds.
		q := rabbitmq.QueueName(topic, s, "test")
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if info.Messages == 0 {
			continue
		}
		ds, err := ch.Consume(q, "drain", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for range info.Messages {
			select {
			case d := <-ds:
				rec := rabbitmq.Record(&d, topic, s)
				c.records = append(c.records, rec)
				c.byID[header(rec, outbox.HeaderID)]++
			case <-time.After(30 * time.Second):
				t.Fatalf("queue %s: %d messages announced, %d read", q, info.Messages, len(c.records))
			}
		}
		if err := ch.Cancel("drain", false); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// waitConfirmed waits until the slot confirmed the server's WAL position
// as it is now.
func (b *bundle) waitConfirmed(t *testing.T, timeout time.Duration) {
	t.Helper()
	end := b.currentLSN(t)
	deadline := time.Now().Add(timeout)
	for b.slotConfirmedLSN(t) < end {
		if time.Now().After(deadline) {
			t.Fatalf("confirmed_flush_lsn %s, still short of %s after %s", b.slotConfirmedLSN(t), end, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// missing is how many of ids c lacks.
func (c *consumed) missing(ids []string) int {
	n := 0
	for _, id := range ids {
		if c.byID[id] == 0 {
			n++
		}
	}
	return n
}

// A stop (SIGTERM) under load waits for RabbitMQ's confirms and confirms
// the WAL behind them before Run returns: the next relay on the slot
// publishes nothing twice.
func TestRabbitMQStopWaitsForConfirms(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	c := consumeRabbit(t, topic)

	cfg := b.cfg
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	first, err := relay.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	// Events written before the slot exists are not in it: start the load
	// once the relay streams.
	for first.State() != relay.StateStreaming {
		select {
		case err := <-done:
			t.Fatalf("relay stopped before streaming: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}

	// The load runs across the stop: the events written after it wait in
	// the outbox for the second relay.
	var idsMu sync.Mutex
	var ids []string
	stopLoad := make(chan struct{})
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		for seq := 0; ; seq++ {
			select {
			case <-stopLoad:
				return
			default:
			}
			var batch []outbox.Event
			for a := range 7 {
				batch = append(batch, evt("order", fmt.Sprintf("agg-%d", a), seq))
			}
			got, err := outbox.Write(b.ctx, b.db.Pool, batch...)
			if err != nil {
				t.Errorf("write: %v", err)
				return
			}
			idsMu.Lock()
			for _, id := range got {
				ids = append(ids, id.String())
			}
			idsMu.Unlock()
		}
	}()
	// Stop with publishes unconfirmed, so that a stop that did not wait
	// for their confirms would leave them to be published again.
	for c.total() < 1000 || unconfirmed(t, reg) < 20 {
		time.Sleep(time.Millisecond)
	}
	cancel() // what SIGTERM does
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after the stop: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("Run did not return within 40 s of the stop")
	}
	stoppedAt := c.total()

	b.start(t, b.cfg)
	for c.total() < stoppedAt+1000 {
		time.Sleep(20 * time.Millisecond)
	}
	close(stopLoad)
	<-loadDone
	idsMu.Lock()
	all := append([]string(nil), ids...)
	idsMu.Unlock()
	got := c.wait(t, all, time.Minute, 500*time.Millisecond)
	if n := got.duplicates(); n != 0 {
		t.Fatalf("%d events published twice across a stop and a restart, want 0", n)
	}
	got.checkFirstArrivalOrder(t)
	t.Logf("%d events, %d before the stop, none twice", len(all), stoppedAt)
}

// unconfirmed reads the relay's ferry_relay_unconfirmed_records.
func unconfirmed(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ferry_relay_unconfirmed_records" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

func (c *rabbitConsumer) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.records)
}

// A required consumer (RabbitMQConfig.Consumers) whose shard queues do not
// exist holds its exchange: nothing reaches the consumers that do have
// queues, which would otherwise take the events while they pass by the
// missing one unseen (the broker returns nothing: the message was
// routed). Ready names the consumer; once its queues are declared, every
// event reaches both consumers and nothing is quarantined. The relay runs
// as the least-privilege user: the queue check needs no permission.
func TestRabbitMQRequiredConsumerHoldsTheExchange(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic) // consumer "test"
	u, err := url.Parse(need(t, ferrytest.EnvRabbitMQURL))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(need(t, ferrytest.EnvRabbitMQRelayUser))
	cfg := b.cfg
	cfg.RabbitMQ = &relay.RabbitMQConfig{
		URL: u.String(), Password: need(t, ferrytest.EnvRabbitMQRelayPassword),
		Consumers: []string{"test", "late"},
	}
	r := b.start(t, cfg)
	present := consumeRabbit(t, topic)
	ids := b.writeAggregates(t, "order", 8, 0, 5)

	deadline := time.Now().Add(30 * time.Second)
	for {
		err := r.Ready()
		if err != nil && strings.Contains(err.Error(), `consumer "late"`) && strings.Contains(err.Error(), rabbitmq.QueueName(topic, 0, "late")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v, want it to name consumer late and its missing queue", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := present.total(); n != 0 {
		t.Fatalf("%d events reached consumer test while consumer late had no queues: they passed late by", n)
	}

	ch, err := rabbitAdmin(t).Channel()
	if err != nil {
		t.Fatal(err)
	}
	late := &rabbitmq.Topology{Consumer: "late", Topics: []string{topic}, Shards: rabbitmq.ShardsDefault}
	if err := rabbitmq.Declare(ch, late); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for s := range late.Shards {
			_, _ = ch.QueueDelete(rabbitmq.QueueName(topic, s, "late"), false, false, false)
		}
	})
	got := present.wait(t, ids, time.Minute, 0)
	got.checkFirstArrivalOrder(t)
	for s := range late.Shards {
		q, err := ch.QueueDeclarePassive(rabbitmq.QueueName(topic, s, "late"), true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		present.mu.Lock()
		want := 0
		for _, rec := range present.records {
			if rec.Partition == int32(s) {
				want++
			}
		}
		present.mu.Unlock()
		if q.Messages != want {
			t.Errorf("consumer late's shard %d queue holds %d messages, consumer test's got %d", s, q.Messages, want)
		}
	}
	b.waitConfirmed(t, 30*time.Second)
	if st, err := relay.Status(b.ctx, b.db.Pool, b.slot); err != nil || st.Quarantined != 0 {
		t.Errorf("Status = %+v, %v: want nothing quarantined", st, err)
	}
}

// `relay recover` on RabbitMQ: the gap a dropped slot left is republished
// to the shard queues from the outbox, the relay streams on from the new
// slot, and every event arrives, each aggregate's in order of first
// arrival.
func TestRecoverRepublishesTheGapToRabbitMQ(t *testing.T) {
	t.Parallel()
	b := rabbitSetup(t)
	topic := b.prefix + ".order"
	declare(t, topic)
	c := consumeRabbit(t, topic)
	if err := relay.Setup(b.ctx, b.db.Pool, b.slot, b.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	_, stop := runUntilStopped(t, b.cfg)
	var ids []string
	for i := range 3 {
		ids = append(ids, b.write(t, evt("order", "a", i), evt("order", "b", i))...)
	}
	c.wait(t, ids, time.Minute, 0)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b.dropSlot(t)
	for i := 3; i < 6; i++ {
		ids = append(ids, b.write(t, evt("order", "a", i), evt("order", "b", i))...) // the gap
	}
	r, err := relay.New(&b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Recover(b.ctx, nil)
	if err != nil || res.Republished < 6 {
		t.Fatalf("Recover to RabbitMQ = %+v, %v; want the gap (6 events) republished", res, err)
	}
	_, stop = runUntilStopped(t, b.cfg)
	ids = append(ids, b.write(t, evt("order", "a", 6))...)
	got := c.wait(t, ids, time.Minute, 0)
	got.checkFirstArrivalOrder(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
