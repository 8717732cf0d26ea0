package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// passEvidence lets every request through the gates: this test is about
// what the worker does with the channels, not about the gates.
type passEvidence struct{}

func (passEvidence) ShadowGate(context.Context, migration.Plan, string) error   { return nil }
func (passEvidence) Drained(context.Context, migration.Plan, string, int) error { return nil }

// liveMigration is a relay moving one aggregate type from a topic on
// cluster A to a topic of another template on cluster B while events flow,
// and a worker that knows only the old topic.
type liveMigration struct {
	*bundle
	oldTopic, newTopic string
	slot               string
	ctl                *migration.Controller
	written            atomic.Int64
	// app is the writing application's own pool: the worker's (db.Pool,
	// max(4, cores) connections) may be all held by transactions a test
	// keeps open, and must not throttle the load.
	app *pgxpool.Pool
	// writeEvery paces writeUntil's load (0: as fast as it goes).
	writeEvery time.Duration
	// rabbitOld is the worker's RabbitMQ settings when the old channel is
	// RabbitMQ (nil: it is Kafka).
	rabbitOld  *RabbitMQConfig
	oldChannel migration.Channel
	// foreign publishes to the old RabbitMQ channel through a bridge
	// (nil: no producer but Ferry's).
	foreign *foreignProducer
}

// publishRabbitDeadLetter writes dl to its topic's dead-letter exchange
// on the old RabbitMQ channel, as a worker does.
func (m *liveMigration) publishRabbitDeadLetter(dl *kgo.Record) {
	m.t.Helper()
	topic := strings.TrimSuffix(dl.Topic, DeadLetterSuffixDefault)
	b := &rbundle{t: m.t, ctx: m.ctx, rcfg: *m.rabbitOld, topic: topic}
	d := b.rcfg.withDefaults()
	conn, err := d.conn(" test").Dial(rabbitNames)
	if err != nil {
		m.t.Fatal(err)
	}
	defer conn.Close()
	if b.pub, err = conn.Channel(); err != nil {
		m.t.Fatal(err)
	}
	if err := b.pub.Confirm(false); err != nil {
		m.t.Fatal(err)
	}
	rec := *dl
	rec.Topic = topic + rabbitmq.DeadLetterExchangeSuffix
	b.publish(&rec)
}

// workerConfig is config for a worker of the old channel.
func (m *liveMigration) workerConfig() *Config {
	cfg := m.config()
	if m.rabbitOld != nil {
		cfg.KafkaOpts, cfg.RabbitMQ = nil, m.rabbitOld
	}
	return cfg
}

func setupLiveMigration(t *testing.T) *liveMigration {
	t.Helper()
	return setupLiveMigrationFor(t, 4*time.Minute)
}

// setupLiveMigrationFor is setupLiveMigration with a test of at most d.
func setupLiveMigrationFor(t *testing.T, d time.Duration) *liveMigration {
	t.Helper()
	return setupLiveMigrationTo(t, d, migration.Kafka)
}

// setupLiveMigrationTo is setupLiveMigrationFor with a new channel of
// kind: cluster B, or the stack's RabbitMQ (16 shards, the consumer's
// queues declared).
func setupLiveMigrationTo(t *testing.T, d time.Duration, kind migration.Kind) *liveMigration {
	t.Helper()
	return setupLiveMigrationKinds(t, d, migration.Kafka, kind)
}

// setupLiveMigrationKinds is setupLiveMigrationTo from an old channel of
// oldKind: cluster A, or the stack's RabbitMQ, which the relay and the
// worker (m.rabbitOld) then use as their own.
func setupLiveMigrationKinds(t *testing.T, d time.Duration, oldKind, kind migration.Kind) *liveMigration {
	t.Helper()
	ctx := ferrytest.Context(t, d)
	db := ferrytest.NewMigratedDB(t)
	if _, err := db.Pool.Exec(ctx, effectsTable); err != nil {
		t.Fatal(err)
	}
	suffix := ferrytest.Suffix()
	oldTemplate, newTemplate := "mig."+suffix+".{aggregate_type}", "migb."+suffix+".{aggregate_type}"
	m := &liveMigration{
		bundle: &bundle{t: t, ctx: ctx, db: db, consumer: ferrytest.Name(t, "c"),
			kopts: []kgo.Opt{kgo.SeedBrokers(ferrytest.Brokers(t)...)}},
		oldTopic: "mig." + suffix + ".order",
		newTopic: "migb." + suffix + ".order",
		ctl:      &migration.Controller{DB: db.Pool, Evidence: passEvidence{}},
		slot:     "ferry_" + suffix,
	}
	m.topic = m.oldTopic
	relayCfg := relay.Config{DatabaseURL: db.URL, Slot: m.slot, TopicTemplate: oldTemplate, KafkaOpts: m.kopts, Logger: testLogger(t)}
	oldChannel := migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: oldTemplate}
	if oldKind == migration.RabbitMQ {
		oldTemplate = "outbox.mig" + suffix + ".{aggregate_type}"
		m.oldTopic, m.topic = "outbox.mig"+suffix+".order", "outbox.mig"+suffix+".order"
		rc := rabbitConfig(t)
		rc.Shards = rabbitmq.ShardsDefault
		m.rabbitOld = &rc
		relayCfg.KafkaOpts, relayCfg.TopicTemplate = nil, oldTemplate
		relayCfg.RabbitMQ = &relay.RabbitMQConfig{URL: rc.URL, Password: rc.Password, Shards: rc.Shards}
		oldChannel = migration.Channel{Kind: migration.RabbitMQ, URL: rc.URL, PasswordEnv: ferrytest.EnvRabbitMQPassword,
			TopicTemplate: oldTemplate, Shards: rc.Shards}
		declareRabbit(t, m.consumer, m.oldTopic)
	}
	app, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	m.app = app
	if oldKind == migration.Kafka {
		ferrytest.CreateTopic(t, m.oldTopic, 3)
		ferrytest.CreateTopic(t, m.oldTopic+DeadLetterSuffixDefault, 1)
	}
	newChannel := migration.Channel{Brokers: ferrytest.BrokersB(t), TopicTemplate: newTemplate}
	if kind == migration.RabbitMQ {
		newChannel = migration.Channel{Kind: migration.RabbitMQ, URL: os.Getenv(ferrytest.EnvRabbitMQURL),
			PasswordEnv: ferrytest.EnvRabbitMQPassword, TopicTemplate: newTemplate, Shards: rabbitmq.ShardsDefault}
		declareRabbit(t, m.consumer, m.newTopic)
	} else {
		ferrytest.CreateTopicB(t, m.newTopic, 4)
		ferrytest.CreateTopicB(t, m.newTopic+DeadLetterSuffixDefault, 1)
	}

	if err := relay.Setup(ctx, db.Pool, m.slot, "ferry", nil); err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(&relayCfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		stopRelay()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	m.oldChannel = oldChannel
	err = m.ctl.Create(ctx, migration.Plan{Name: "move",
		Old:    oldChannel,
		New:    newChannel,
		Groups: []string{m.consumer}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// writeUntil commits events of 8 aggregates, one per transaction, each
// aggregate's payload its next sequence number, until stop is closed.
func (m *liveMigration) writeUntil(stop <-chan struct{}) <-chan error {
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		next := map[string]int{}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Sprintf("agg-%d", i%8)
			next[key]++
			_, err := outbox.Write(m.ctx, m.app, outbox.Event{AggregateType: "order", AggregateID: key,
				EventType: "Changed", Payload: []byte(strconv.Itoa(next[key]))})
			if err != nil {
				errs <- err
				return
			}
			m.written.Add(1)
			if m.writeEvery > 0 {
				time.Sleep(m.writeEvery) // a pace, not a wait for anything
			}
		}
	}()
	return errs
}

// afterMore waits until n more events were written.
func (m *liveMigration) afterMore(n int64) {
	m.t.Helper()
	target := m.written.Load() + n
	m.waitFor(fmt.Sprintf("%d events written", target), func() (bool, error) { return m.written.Load() >= target, nil })
}

func (m *liveMigration) request(to migration.Phase, slices int) {
	m.t.Helper()
	d, err := m.ctl.Request(m.ctx, "move", to, slices, "test")
	if err != nil || !d.Accepted {
		m.t.Fatalf("request %s %d: %+v, %v", to, slices, d, err)
	}
}

// cutoverOnceTheGatePasses asks for CUTOVER to slices once the shadow gate
// passes. Copies keep arriving while events are written, and on a loaded
// machine one can outlive its allowed lateness between the check and the
// request, which the controller then rightly refuses (a test on PostgreSQL
// 17, beside the fault suite, failed so): it asks again while that is the
// reason, and fails on any other.
func (m *liveMigration) cutoverOnceTheGatePasses(ev *migration.ReportEvidence, plan migration.Plan, slices int) {
	m.t.Helper()
	last := ""
	say := func(why string) { // what kept the gate closed, when it changes
		if why != last {
			m.t.Logf("CUTOVER %d waits: %s", slices, why)
			last = why
		}
	}
	m.waitFor(fmt.Sprintf("CUTOVER %d to be accepted", slices), func() (bool, error) {
		if err := ev.ShadowGate(m.ctx, plan, m.consumer); err != nil {
			say(err.Error())
			return false, nil
		}
		d, err := m.ctl.Request(m.ctx, "move", migration.Cutover, slices, "test")
		switch {
		case err != nil:
			return false, err
		case d.Accepted:
			return true, nil
		case strings.Contains(d.Reason, "shadow gate not passed"):
			say(d.Reason)
			return false, nil
		}
		return false, fmt.Errorf("CUTOVER %d refused: %s", slices, d.Reason)
	})
}

// Events flow while the plan goes through dual writing, two cutover steps,
// a rollback, the cutover again and the retirement. The worker, configured
// with the old topic only, learns the new channel from the fences, consumes
// it too, and applies every event exactly once and each aggregate's events
// in order, although it applies the old channel slowly (so the new one is
// ahead): an authoritative copy of a moved slice waits for the old
// channel's fences.
func TestWorkerFollowsALiveMigrationOnceAndInOrder(t *testing.T) {
	t.Parallel()
	followsOnceAndInOrder(t, setupLiveMigration(t))
}

// The same, from RabbitMQ to Kafka: the worker, configured for RabbitMQ
// only, learns the Kafka channel from the fences on its shard queues and
// consumes the new topic in its group there.
func TestWorkerFollowsALiveMigrationFromRabbitMQOnceAndInOrder(t *testing.T) {
	t.Parallel()
	followsOnceAndInOrder(t, setupLiveMigrationKinds(t, 4*time.Minute, migration.RabbitMQ, migration.Kafka))
}

// The same, from Kafka to RabbitMQ: the worker, configured for Kafka
// only, learns the RabbitMQ channel from the fences and consumes its
// shard queues too; an authoritative copy on a shard queue waits for the
// fences on every partition of the old topic, and a copy on the old topic
// after the rollback for those on every shard queue.
func TestWorkerFollowsALiveMigrationToRabbitMQOnceAndInOrder(t *testing.T) {
	t.Parallel()
	m := setupLiveMigrationTo(t, 4*time.Minute, migration.RabbitMQ)
	followsOnceAndInOrder(t, m)
	// The group's lag on the RabbitMQ new channel is in its reports.
	ev := &migration.ReportEvidence{MaxAge: time.Minute}
	m.waitFor("a report with the lag on the new channel", func() (bool, error) {
		reports, err := ev.Reports(m.ctx, migration.Plan{Name: "move", Old: m.oldChannel})
		r := reports[m.consumer]
		return err == nil && r.NewLag != nil && *r.NewLag >= 0 && r.OldLag == nil, nil
	})
}

// followsOnceAndInOrder runs the plan of m through every phase while
// events flow, and checks each event applied once, in order per
// aggregate, from both channels.
func followsOnceAndInOrder(t *testing.T, m *liveMigration) {
	cfg := m.workerConfig()
	cfg.KeyConcurrency = 4
	cfg.IDFromPayloadHash = m.foreign != nil // some foreign messages have no id
	if m.foreign != nil {
		// The drain is asked for while the foreign producer publishes.
		cfg.MigrationReportInterval = 200 * time.Millisecond
		cfg.RetryBackoffMax, cfg.HandlerTimeout = time.Second, 5*time.Second
		// Paced: the drain waits out the old work's quiet window while
		// the load flows, and unpaced the writer puts 50,000 events
		// through the relay and the worker meanwhile.
		m.writeEvery = 3 * time.Millisecond
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.Handle(m.consumer, m.oldTopic, func(ctx context.Context, tx pgx.Tx, msg *Message) error {
		if msg.Topic == m.oldTopic {
			time.Sleep(10 * time.Millisecond) // the old channel lags
			if strings.HasPrefix(string(msg.Key), "foreign-") {
				// Far behind for the foreign aggregates: their shards
				// still hold messages from before the bridge's queues
				// when its copies arrive on the new channel.
				time.Sleep(40 * time.Millisecond)
			}
		}
		return insertEffect(ctx, tx, msg, msg.Topic)
	})
	m.start(w)

	stop := make(chan struct{})
	errs := m.writeUntil(stop)
	m.afterMore(100)
	for _, step := range []struct {
		phase  migration.Phase
		slices int
	}{
		{migration.DualWrite, 0},
		{migration.Cutover, 32},
		{migration.Cutover, migration.Slices},
		{migration.DualWrite, 0}, // rollback
		{migration.Cutover, migration.Slices},
		{migration.OldRetired, 0},
	} {
		m.request(step.phase, step.slices)
		m.afterMore(150)
	}
	if m.foreign != nil {
		m.foreign.drainsWhileBridged(t, 5)
	}
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	total, foreign := int(m.written.Load()), 0
	if m.foreign != nil {
		foreign = m.foreign.stop(t)
	}
	m.waitFor(fmt.Sprintf("%d events applied", total+foreign), func() (bool, error) {
		return m.count(`SELECT count(DISTINCT message_id) FROM effects`) >= total+foreign, nil
	})
	if m.foreign != nil {
		m.foreign.check(t, foreign)
	}

	if n := m.count(`SELECT count(*) FROM (SELECT message_id FROM effects GROUP BY message_id HAVING count(*) > 1) d`); n > 0 {
		t.Errorf("%d events applied more than once", n)
	}
	if n := m.count(`SELECT count(*) FROM outbox o WHERE NOT EXISTS (SELECT 1 FROM effects e WHERE e.message_id = o.id::text)`); n > 0 {
		t.Errorf("%d events never applied", n)
	}
	rows, err := m.db.Pool.Query(m.ctx, `SELECT key, seq FROM effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	for rows.Next() {
		var key string
		var seq int
		if err := rows.Scan(&key, &seq); err != nil {
			t.Fatal(err)
		}
		if seq != last[key]+1 {
			t.Errorf("aggregate %s: event %d applied after event %d", key, seq, last[key])
		}
		last[key] = seq
	}
	rows.Close()
	for _, q := range []struct {
		what  string
		query string
	}{
		{"events applied from the new channel", `SELECT count(*) FROM effects WHERE worker = '` + m.newTopic + `'`},
		{"events applied from the old channel", `SELECT count(*) FROM effects WHERE worker = '` + m.oldTopic + `'`},
		{"channels learned", `SELECT count(*) FROM ferry_inbox_channel WHERE peer = '` + m.newTopic + `'`},
		{"fences passed on the old channel", `SELECT count(*) FROM ferry_inbox_fence WHERE side = 'old'`},
		{"fences passed on the new channel", `SELECT count(*) FROM ferry_inbox_fence WHERE side = 'new'`},
		{"shadow copies recorded", `SELECT count(*) FROM ferry_inbox_copy WHERE role = 'shadow'`},
	} {
		if n := m.count(q.query); n == 0 {
			t.Errorf("no %s", q.what)
		}
	}
	t.Logf("%d events; applied from the old channel %d, from the new %d; copies held for fences %v", total,
		m.count(`SELECT count(*) FROM effects WHERE worker = '`+m.oldTopic+`'`),
		m.count(`SELECT count(*) FROM effects WHERE worker = '`+m.newTopic+`'`), heldCount(w, m.consumer))
}

// heldCount is how many copies the worker held for fences.
func heldCount(w *Worker, consumer string) float64 {
	var m dto.Metric
	if err := w.metrics.migrationHeld.WithLabelValues(consumer).Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// The controller decides from the workers' reports, read from the old
// channel: CUTOVER is refused before the worker checked an event, accepted
// once its report shows copies checked, none missing and no mismatch, and
// refused again while a shadow copy is missing; OLD_RETIRED waits until
// the group passed the fences from which every slice is on the new channel.
func TestTheGatesOpenOnTheWorkersReports(t *testing.T) {
	t.Parallel()
	gatesOpenOnReports(t, setupLiveMigration(t))
}

// The same from a RabbitMQ old channel: the worker's reports go to the
// report stream of its broker, its dead letters are read from its .dlq
// stream, and the controller reads both there.
func TestTheGatesOpenOnReportsThroughRabbitMQ(t *testing.T) {
	t.Parallel()
	gatesOpenOnReports(t, setupLiveMigrationKinds(t, 4*time.Minute, migration.RabbitMQ, migration.Kafka))
}

func gatesOpenOnReports(t *testing.T, m *liveMigration) {
	ev := &migration.ReportEvidence{MaxP99Lateness: 10 * time.Second, MaxAge: time.Minute}
	m.ctl.Evidence = ev
	cfg := m.workerConfig()
	cfg.MigrationReportInterval = 100 * time.Millisecond
	cfg.MigrationAllowedLateness = time.Second
	// A copy late beyond the p99 bound closes the gate until it leaves the
	// window: 30s, not the default 2m, so that a stall of a loaded machine
	// (the suite runs this beside the fault suite) clears within the test.
	// The load is paced for the same reason: unpaced, a 2-core machine
	// under load applies it slower than it is written, and the copies of
	// one channel fall ever further behind the other's.
	cfg.MigrationReportWindow = 30 * time.Second
	// The quiet a RabbitMQ old channel's drain waits for (Report.OldQuiet).
	cfg.RetryBackoffMax, cfg.HandlerTimeout = time.Second, 5*time.Second
	m.writeEvery = 3 * time.Millisecond
	m.startEffects(cfg)
	plan := migration.Plan{Name: "move", Old: m.oldChannel}

	m.request(migration.DualWrite, 0)
	d, err := m.ctl.Request(m.ctx, "move", migration.Cutover, 64, "test")
	if err != nil || d.Accepted || !strings.Contains(d.Reason, "shadow gate not passed: group "+m.consumer) {
		t.Fatalf("CUTOVER before any report: %+v, %v; want a rejection naming the group", d, err)
	}

	stop := make(chan struct{})
	errs := m.writeUntil(stop)
	m.cutoverOnceTheGatePasses(ev, plan, 64)

	// A shadow copy that never comes (as on a lossy channel): the gate
	// closes, naming it.
	if _, err := m.db.Pool.Exec(m.ctx, `INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest, received_at)
		VALUES ($1, 'lost-1', 'move', 'new', 'authoritative', 2, '\x00', now() - interval '3 seconds')`, m.consumer); err != nil {
		t.Fatal(err)
	}
	m.waitFor("the gate to report the missing copy", func() (bool, error) {
		err := ev.ShadowGate(m.ctx, plan, m.consumer)
		return err != nil && strings.Contains(err.Error(), "1 shadow copies missing"), nil
	})

	if _, err := m.db.Pool.Exec(m.ctx, `DELETE FROM ferry_inbox_copy WHERE message_id = 'lost-1'`); err != nil {
		t.Fatal(err)
	}
	m.cutoverOnceTheGatePasses(ev, plan, migration.Slices)
	m.request(migration.DualWrite, 0) // the rollback drill
	m.cutoverOnceTheGatePasses(ev, plan, migration.Slices)
	allNew := 5
	m.afterMore(50)
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	m.waitFor("the group to pass the fences of the last cutover", func() (bool, error) {
		return ev.Drained(m.ctx, plan, m.consumer, allNew) == nil, nil
	})

	// A message the group dead-lettered on the old channel, never applied:
	// the old cluster would take it along, so the drain waits for it, and
	// passes once it is applied (redriven, for instance).
	dl := &kgo.Record{Topic: m.oldTopic + DeadLetterSuffixDefault, Key: []byte("k"), Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: outbox.HeaderID, Value: []byte("dead-1")}, {Key: HeaderDeadLetterConsumer, Value: []byte(m.consumer)},
		{Key: HeaderDeadLetterFailedAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
		{Key: HeaderDeadLetterOriginalTopic, Value: []byte(m.oldTopic)}, {Key: HeaderDeadLetterOriginalPartition, Value: []byte("0")}}}
	if m.rabbitOld != nil {
		m.publishRabbitDeadLetter(dl)
	} else if err := ferrytest.Client(t).ProduceSync(m.ctx, dl).FirstErr(); err != nil {
		t.Fatal(err)
	}
	m.waitFor("the drain to refuse over the dead letter", func() (bool, error) {
		err := ev.Drained(m.ctx, plan, m.consumer, allNew)
		return err != nil && strings.Contains(err.Error(), "1 messages it dead-lettered on the old channel"), nil
	})
	if d, err := m.ctl.Request(m.ctx, "move", migration.OldRetired, 0, "test"); err != nil || d.Accepted {
		t.Fatalf("OLD_RETIRED with a dead letter left on the old channel: %+v, %v; want it refused", d, err)
	}
	if _, err := m.db.Pool.Exec(m.ctx, `INSERT INTO inbox (consumer, message_id) VALUES ($1, 'dead-1')`, m.consumer); err != nil {
		t.Fatal(err)
	}
	m.waitFor("the drain to pass once the dead letter was applied", func() (bool, error) {
		return ev.Drained(m.ctx, plan, m.consumer, allNew) == nil, nil
	})
	if err := ev.Drained(m.ctx, plan, m.consumer, allNew+1); err == nil || !strings.Contains(err.Error(), "not yet 6") {
		t.Fatalf("Drained for a later epoch = %v, want a refusal naming it", err)
	}
	if m.rabbitOld != nil {
		oldQuietHoldsTheDrain(t, m, ev, plan, allNew)
	}
	m.request(migration.OldRetired, 0)
}

// oldQuietHoldsTheDrain publishes a message of a producer that is not
// Ferry's, and that no bridge copies, to the RabbitMQ old channel: the
// drain refuses until the channel brought the group nothing to apply for
// the quiet its report names (RetryBackoffMax + HandlerTimeout: 6s), and then
// passes. The fences say nothing of such a message.
func oldQuietHoldsTheDrain(t *testing.T, m *liveMigration, ev *migration.ReportEvidence, plan migration.Plan, epoch int) {
	t.Helper()
	crossPublisher(t, m)("unbridged", 1)
	m.waitFor("the message applied", func() (bool, error) {
		return m.count(`SELECT count(*) FROM effects WHERE message_id = 'unbridged-0'`) == 1, nil
	})
	var refused error
	m.waitFor("the drain to refuse over the message", func() (bool, error) {
		refused = ev.Drained(m.ctx, plan, m.consumer, epoch)
		return refused != nil && strings.Contains(refused.Error(), "must bring it nothing to apply for 6s"), nil
	})
	t.Logf("refused: %v", refused)
	reports, err := ev.Reports(m.ctx, plan)
	if r := reports[m.consumer]; err != nil || r.OldLag == nil || r.NewLag != nil {
		t.Errorf("report %+v, %v: want the lag on the RabbitMQ old channel, none on the Kafka new one", r, err)
	}
	m.waitFor("the drain to pass once the old channel was quiet", func() (bool, error) {
		return ev.Drained(m.ctx, plan, m.consumer, epoch) == nil, nil
	})
}

// M3, quarantine not silence: an event whose shadow copy arrived and whose
// authoritative copy never did (lost on the other channel: the group
// consumed the partition it would be on) goes to the migration quarantine
// with its record; one whose authoritative copy came does not. Replayed,
// it is applied once, and leaves the quarantine.
func TestAnUnappliedShadowIsQuarantinedThenReplayedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	newTopic := b.twoChannels(1)
	b.produce(b.stamped("m-lost", migration.OldSide, route.Shadow), b.stamped("m-ok", migration.OldSide, route.Shadow))
	b.produceTo(migration.NewSide, b.copyOf(newTopic, 0, "m-ok", "k-m-ok", migration.NewSide, route.Authoritative, 1))
	cfg := b.config()
	cfg.MigrationReportInterval = 50 * time.Millisecond
	cfg.MigrationQuarantineAfter = 200 * time.Millisecond
	w := b.newWorker(cfg, effectHandler)
	b.start(w)

	var q []MigrationQuarantined
	b.waitFor("m-lost quarantined", func() (bool, error) {
		var err error
		q, err = ListMigrationQuarantined(b.ctx, b.db.Pool, b.consumer)
		return len(q) > 0, err
	})
	if len(q) != 1 || q[0].ID != "m-lost" || q[0].Side != migration.OldSide || string(q[0].Value) != "1" || q[0].Topic != b.topic {
		t.Fatalf("quarantine %+v, want m-lost alone, with its record", q)
	}
	if b.effects("m-lost") != 0 || b.effects("m-ok") != 1 {
		t.Fatalf("effects before the replay: m-lost %d, m-ok %d; want 0 and 1", b.effects("m-lost"), b.effects("m-ok"))
	}
	if err := ReplayMigrationQuarantined(b.ctx, b.db.Pool, b.kopts, q[0]); err != nil {
		t.Fatal(err)
	}
	b.waitFor("m-lost applied", func() (bool, error) { return b.effects("m-lost") == 1, nil })
	if err := ReplayMigrationQuarantined(b.ctx, b.db.Pool, b.kopts, q[0]); !errors.Is(err, ErrNoLongerQuarantined) {
		t.Fatalf("a second replay = %v, want it to say the event was no longer quarantined", err)
	}
	// The fence, two shadows and the first replay: the second publishes
	// nothing.
	b.waitCommitted(b.consumer, 0, 4)
	if n := b.effects("m-lost"); n != 1 {
		t.Fatalf("m-lost applied %d times after two replays, want 1", n)
	}
	if q, err := ListMigrationQuarantined(b.ctx, b.db.Pool, b.consumer); err != nil || len(q) != 0 {
		t.Fatalf("quarantine after the replay: %+v, %v", q, err)
	}
}

// A dead letter is not a lost event: an authoritative copy the handler
// refused for good goes to the dead-letter topic, and its shadow copy must
// not send it to the migration quarantine as well (found by the fault
// suite's lossy-channel run: the poison events were quarantined, which
// blocked OLD_RETIRED and would have dead-lettered them a second time on
// replay). A lost one beside it still is quarantined.
func TestADeadLetteredAuthoritativeCopyIsNotQuarantined(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	newTopic := b.twoChannels(1)
	b.produceTo(migration.NewSide, b.copyOf(newTopic, 0, "m-poison", "k-m-poison", migration.NewSide, route.Authoritative, 1))
	b.produce(b.stamped("m-poison", migration.OldSide, route.Shadow), b.stamped("m-lost", migration.OldSide, route.Shadow))
	cfg := b.config()
	cfg.MigrationReportInterval = 50 * time.Millisecond
	cfg.MigrationQuarantineAfter = 200 * time.Millisecond
	w := b.newWorker(cfg, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-poison" {
			return Permanent(errors.New("refused on purpose"))
		}
		return effectHandler(ctx, tx, m)
	})
	b.start(w)

	b.waitFor("m-poison dead-lettered on the new channel", func() (bool, error) {
		dls, err := ListDeadLetters(b.ctx, []kgo.Opt{kgo.SeedBrokers(ferrytest.BrokersB(t)...)}, newTopic+DeadLetterSuffixDefault, nil)
		return len(dls) == 1, err
	})
	var q []MigrationQuarantined
	b.waitFor("m-lost quarantined", func() (bool, error) {
		var err error
		q, err = ListMigrationQuarantined(b.ctx, b.db.Pool, b.consumer)
		return slices.ContainsFunc(q, func(q MigrationQuarantined) bool { return q.ID == "m-lost" }), err
	})
	// m-poison's copy row is recorded once its dead letter is written, and
	// the pass that quarantined m-lost found the partition m-poison's
	// authoritative copy is on consumed past it: that copy was finished
	// (dead-lettered, here) before.
	for _, e := range q {
		if e.ID == "m-poison" {
			t.Fatalf("the dead-lettered m-poison is in the migration quarantine too: %+v", e)
		}
	}
}

// A replayed event is in the normal flow again: applied, or dead-lettered
// if its handler refuses it. Either way its shadow is spent and never
// quarantines it again (found by the fault suite's lossy-channel run: a
// poison event whose authoritative copy was lost came back to the
// quarantine after every replay, and OLD_RETIRED was refused for good).
func TestAReplayedEventThatIsDeadLetteredStaysOutOfTheQuarantine(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.twoChannels(1)
	b.produce(b.stamped("m-poison", migration.OldSide, route.Shadow))
	cfg := b.config()
	cfg.MigrationReportInterval = 50 * time.Millisecond
	cfg.MigrationQuarantineAfter = 200 * time.Millisecond
	w := b.newWorker(cfg, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		return Permanent(errors.New("refused on purpose"))
	})
	b.start(w)
	var q []MigrationQuarantined
	b.waitFor("m-poison quarantined", func() (bool, error) {
		var err error
		q, err = ListMigrationQuarantined(b.ctx, b.db.Pool, b.consumer)
		return len(q) == 1, err
	})
	if err := ReplayMigrationQuarantined(b.ctx, b.db.Pool, b.kopts, q[0]); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the replay dead-lettered", func() (bool, error) { return len(b.deadLetters()) == 1, nil })
	// A shadow recorded after the replay was settled (the fence, the shadow
	// and the replay), quarantined in its turn: the pass that took it saw
	// m-poison's older shadow too.
	b.waitCommitted(b.consumer, 0, 3)
	b.produce(b.stamped("m-probe", migration.OldSide, route.Shadow))
	b.waitFor("m-probe quarantined", func() (bool, error) {
		var err error
		q, err = ListMigrationQuarantined(b.ctx, b.db.Pool, b.consumer)
		return slices.ContainsFunc(q, func(q MigrationQuarantined) bool { return q.ID == "m-probe" }), err
	})
	for _, e := range q {
		if e.ID == "m-poison" {
			t.Fatalf("after its replay was dead-lettered, m-poison is in the quarantine again: %+v", e)
		}
	}
}

// stamped is a record of id on partition 0 with a route stamp of plan
// "move", epoch 1, from side in role.
func (b *bundle) stamped(id string, side migration.Side, role route.Role) *kgo.Record {
	r := b.record(id, "k-"+id, 0, 1)
	st := route.Stamp{Plan: "move", Epoch: 1, Slice: route.Slice(r.Key), Side: side, Role: role}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: route.HeaderRoute, Value: []byte(st.String())})
	return r
}

// Each authoritative copy a worker applies is recorded once in
// ferry_inbox_copy, with its plan, side, epoch and payload digest, whether
// it is applied in a batch (its copies in one statement) or alone (its copy
// in the statement that claims it); a copy brought again is neither applied
// nor recorded twice, and a batch that brings copies again is applied whole,
// not message by message after a failed batch transaction. The shadow gate
// counts these rows.
func TestAppliedAuthoritativeCopiesAreRecordedOnce(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 16} {
		t.Run(fmt.Sprintf("batch %d", batch), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			const n = 40
			var recs []*kgo.Record
			for i := range n {
				recs = append(recs, b.stamped(fmt.Sprintf("m-%d", i), migration.OldSide, route.Authoritative))
			}
			for _, id := range []string{"m-3", "m-7", "m-11"} { // brought again, in one batch
				recs = append(recs, b.stamped(id, migration.OldSide, route.Authoritative))
			}
			b.produce(recs...)
			cfg := b.config()
			cfg.BatchSize = batch
			var warnings ferrytest.Buffer
			cfg.Logger = slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))
			b.start(b.newWorker(cfg, effectHandler))
			b.waitCommitted(b.consumer, 0, int64(len(recs)))
			if got := b.count(`SELECT count(*) FROM effects`); got != n {
				t.Fatalf("%d effects, want %d", got, n)
			}
			if warnings.String() != "" {
				t.Fatalf("the worker warned (a batch bringing copies again fails, and its messages are applied one by one):\n%s", warnings.String())
			}
			rows := b.count(`SELECT count(*) FROM ferry_inbox_copy`)
			good := b.count(`SELECT count(DISTINCT c.message_id) FROM ferry_inbox_copy c JOIN inbox i USING (consumer, message_id)
				WHERE c.consumer = $1 AND c.plan = 'move' AND c.side = 'old' AND c.role = 'authoritative' AND c.epoch = 1
				AND c.digest = sha256('1'::bytea) AND NOT c.alone AND c.topic IS NULL`, b.consumer)
			if rows != n || good != n {
				t.Fatalf("ferry_inbox_copy holds %d rows, %d of them the applied authoritative copies as sent; want %d and %d", rows, good, n, n)
			}
		})
	}
}

// A fence in the middle of a batch is passed once the records before it are
// applied, and the records after it go on: with batches, the records before
// the fence used to wait in the batch for the fence, which waited for them
// (found by the fault suite's migration run: the partition stopped for good).
func TestAFenceInsideABatchIsPassed(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var recs []*kgo.Record
	for i := range 5 {
		recs = append(recs, b.record(fmt.Sprintf("m-%d", i), fmt.Sprintf("k-%d", i), 0, i))
	}
	fence := route.Fence{Plan: "move", Epoch: 1, Side: migration.NewSide, Partitions: 1, Peer: "old.topic"}
	recs = append(recs, &kgo.Record{Topic: b.topic, Partition: 0,
		Headers: []kgo.RecordHeader{{Key: route.HeaderFence, Value: []byte(fence.String())}}})
	for i := 5; i < 8; i++ {
		recs = append(recs, b.record(fmt.Sprintf("m-%d", i), fmt.Sprintf("k-%d", i), 0, i))
	}
	b.produce(recs...)
	cfg := b.config()
	cfg.BatchSize = 16
	w := b.newWorker(cfg, effectHandler)
	b.start(w)

	deadline := time.Now().Add(30 * time.Second)
	for b.count(`SELECT count(*) FROM effects`) < 8 || b.count(`SELECT count(*) FROM ferry_inbox_fence`) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %d of 8 effects, %d fences passed; want 8 and 1", b.count(`SELECT count(*) FROM effects`),
				b.count(`SELECT count(*) FROM ferry_inbox_fence`))
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.waitCommitted(b.consumer, 0, int64(len(recs)))
}

// copyRows records synthetic copies of plan "move" for consumer: each event
// id's authoritative copy (old side) at a and its shadow (new side) at s,
// identical payloads.
func (b *bundle) copyRows(ids []string, a, s []time.Time) {
	b.t.Helper()
	if _, err := b.db.Pool.Exec(b.ctx, `
		INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest, received_at)
		SELECT $1, id, 'move', side, role, 1, '\x01', at
		FROM unnest($2::text[], $3::timestamptz[], $4::timestamptz[]) AS c(id, a, s),
		     LATERAL (VALUES ('old', 'authoritative', c.a), ('new', 'shadow', c.s)) AS v(side, role, at)`,
		b.consumer, ids, a, s); err != nil {
		b.t.Fatal(err)
	}
}

// followsMove makes consumer follow plan "move" (as a fence of its old
// channel would): it reports on it.
func (b *bundle) followsMove() {
	b.t.Helper()
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_channel (consumer, plan, side, topic, peer, channel)
		VALUES ($1, 'move', 'old', $2, 'unused.peer', '{}')`, b.consumer, b.topic); err != nil {
		b.t.Fatal(err)
	}
}

// reportingWorker returns a worker of the plan move that reports every
// 100 ms with an allowed lateness of 1 s, by a clock the test moves on
// through offset instead of waiting.
func (b *bundle) reportingWorker() (w *Worker, offset *atomic.Int64, clock func() time.Time) {
	offset = new(atomic.Int64)
	clock = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	cfg := b.config()
	cfg.MigrationReportInterval = 100 * time.Millisecond
	cfg.MigrationAllowedLateness = time.Second
	cfg.hooks.reportClock = clock
	w = b.newWorker(cfg, effectHandler)
	b.followsMove()
	return w, offset, clock
}

// movePlan is the plan move as the evidence reads it: its old channel's
// brokers, for the group lag.
func (b *bundle) movePlan() migration.Plan {
	return migration.Plan{Name: "move", Old: migration.Channel{Brokers: ferrytest.Brokers(b.t), TopicTemplate: "unused"}}
}

// reportAt waits for the consumer's first report made at after or later,
// as ev reads it, and returns it.
func (b *bundle) reportAt(ev *migration.ReportEvidence, after time.Time) migration.Report {
	b.t.Helper()
	var r migration.Report
	b.waitFor("a report made at "+after.Format(time.TimeOnly)+" or later", func() (bool, error) {
		reports, err := ev.Reports(b.ctx, b.movePlan())
		r = reports[b.consumer]
		return err == nil && !r.At.Before(after), nil
	})
	return r
}

// A stall (a broker outage: the shadow copies of five events came 5 s
// after their authoritative copies) closes the shadow gate, and once the
// late copies are older than the report window (MigrationReportWindow,
// 2 minutes by default) it passes again, with nothing else late: the gate
// judges what holds now. Issue 21 item 7: the window was ten minutes, so
// one outage kept CUTOVER refused for ten minutes after it ended. The
// reports' clock is the test's, moved on instead of waited for.
func TestAStallClosesTheGateOnlyForTheReportWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	w, offset, clock := b.reportingWorker()

	base := time.Now()
	var ids []string
	var as, ss []time.Time
	for i := range 5 { // the stall
		ids = append(ids, fmt.Sprintf("late-%d", i))
		as, ss = append(as, base.Add(-20*time.Second)), append(ss, base.Add(-15*time.Second))
	}
	for i := range 300 { // on time, from before the stall's end to 3 minutes after it
		at := base.Add(-10*time.Second + time.Duration(i)*190*time.Second/300)
		ids = append(ids, fmt.Sprintf("ok-%d", i))
		as, ss = append(as, at), append(ss, at.Add(10*time.Millisecond))
	}
	b.copyRows(ids, as, ss)
	b.start(w)

	ev := &migration.ReportEvidence{MaxP99Lateness: time.Second, MaxAge: time.Minute, Now: clock}
	gateAt := func(after time.Time) (migration.Report, error) {
		t.Helper()
		r := b.reportAt(ev, after)
		return r, ev.ShadowGate(b.ctx, b.movePlan(), b.consumer)
	}
	_, err := gateAt(base)
	if err == nil || !strings.Contains(err.Error(), "p99 lateness 5s above 1s") {
		t.Fatalf("the gate right after the stall: %v; want it closed for the p99 lateness", err)
	}
	// It says by when it passes if nothing else is late: once the stall's
	// last copies (15 s before base) are older than the window.
	want := base.Add(-15*time.Second + MigrationReportWindowDefault)
	_, rest, ok := strings.Cut(err.Error(), "if no copy is late from now on, the gate passes by ")
	by, perr := time.Parse(time.RFC3339, strings.SplitN(rest, ",", 2)[0])
	if !ok || perr != nil || by.Sub(want).Abs() > time.Second {
		t.Fatalf("the gate right after the stall: %v; want it to say it passes by %s if nothing else is late", err, want.UTC().Format(time.RFC3339))
	}
	offset.Store(int64(2*time.Minute + 10*time.Second))
	if r, err := gateAt(base.Add(2*time.Minute + 10*time.Second)); err != nil {
		t.Fatalf("the gate 2m10s after the stall, the stall's copies out of the default window and nothing else late: %v "+
			"(report: %d checked, p99 %s, window %s)", err, r.Checked, r.P99Lateness, r.Window)
	}
}

// A shadow copy that came before its authoritative copy (the old channel
// behind the new one) is not missing once it is older than the report
// window and its authoritative copy is not: the report judges the events
// of which a copy is in the window, each with both its copies. Issue 21
// item 6: the report looked for the shadow inside the window only, so as
// the window passed over such events it counted their shadows missing
// (969 and 1,075 in the run, with every event applied and lag 0).
// The reports' clock is the test's.
func TestAShadowThatCameFirstIsNotMissing(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	w, offset, clock := b.reportingWorker()
	base := time.Now()
	var ids []string
	var as, ss []time.Time
	for i := range 20 { // the shadow 10 s first
		ids = append(ids, fmt.Sprintf("first-%d", i))
		as, ss = append(as, base.Add(-50*time.Second)), append(ss, base.Add(-60*time.Second))
	}
	b.copyRows(ids, as, ss)
	// The window's start between the shadows and their authoritative copies.
	at := base.Add(-55*time.Second + MigrationReportWindowDefault)
	offset.Store(int64(at.Sub(base)))
	b.start(w)

	ev := &migration.ReportEvidence{MaxP99Lateness: time.Minute, MaxAge: time.Minute, Now: clock}
	r := b.reportAt(ev, at)
	if r.Missing != 0 || r.Checked != 20 || r.P99Lateness != 10*time.Second {
		t.Fatalf("report with every shadow 10 s before its authoritative copy, the window starting between them: %d missing, %d checked, "+
			"p99 %s; want 0 missing, 20 checked, p99 10s", r.Missing, r.Checked, r.P99Lateness)
	}
}

// Once the old channel is retired the relay writes each event to the new
// channel alone: none has a shadow to miss. Issue 21 item 5: the report
// counted every such event as a missing shadow ("fails: 21330 shadow
// copies missing beyond the allowed lateness of 30s", load stopped, lag 0).
func TestNoShadowIsMissingAfterOldRetired(t *testing.T) {
	t.Parallel()
	m := setupLiveMigration(t)
	cfg := m.config()
	cfg.MigrationReportInterval = 100 * time.Millisecond
	cfg.MigrationAllowedLateness = time.Second
	// A copy late beyond the p99 bound closes the gate until it leaves the
	// window: 30s, not the default 2m, so that a stall of a loaded machine
	// (the suite runs this beside the fault suite) clears within the test.
	// The load is paced for the same reason: unpaced, a 2-core machine
	// under load applies it slower than it is written, and the copies of
	// one channel fall ever further behind the other's.
	cfg.MigrationReportWindow = 30 * time.Second
	m.writeEvery = 3 * time.Millisecond
	m.startEffects(cfg)
	stop := make(chan struct{})
	errs := m.writeUntil(stop)
	m.afterMore(50)
	m.request(migration.DualWrite, 0)
	m.afterMore(100)
	m.request(migration.Cutover, migration.Slices)
	m.request(migration.DualWrite, 0) // the rollback drill
	m.request(migration.Cutover, migration.Slices)
	m.afterMore(100)
	m.request(migration.OldRetired, 0)
	m.afterMore(200) // written to the new channel alone
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	total, foreign := int(m.written.Load()), 0
	if m.foreign != nil {
		foreign = m.foreign.stop(t)
	}
	m.waitFor(fmt.Sprintf("%d events applied", total+foreign), func() (bool, error) {
		return m.count(`SELECT count(DISTINCT message_id) FROM effects`) >= total+foreign, nil
	})
	if m.foreign != nil {
		m.foreign.check(t, foreign)
	}
	var last time.Time
	if err := m.db.Pool.QueryRow(m.ctx, `SELECT max(received_at) FROM ferry_inbox_copy WHERE consumer = $1`, m.consumer).Scan(&last); err != nil {
		t.Fatal(err)
	}
	ev := &migration.ReportEvidence{MaxP99Lateness: time.Minute, MaxAge: time.Minute}
	plan := migration.Plan{Name: "move", Old: migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "unused"}}
	var r migration.Report
	m.waitFor("a report made when every copy is past its allowed lateness", func() (bool, error) {
		reports, err := ev.Reports(m.ctx, plan)
		r = reports[m.consumer]
		return err == nil && r.At.After(last.Add(cfg.MigrationAllowedLateness)), nil
	})
	retired := m.count(`SELECT count(*) FROM ferry_inbox_copy c WHERE role = 'authoritative'
		AND NOT EXISTS (SELECT 1 FROM ferry_inbox_copy s WHERE s.message_id = c.message_id AND s.role = 'shadow')`)
	if retired == 0 || r.Missing != 0 {
		t.Fatalf("%d events written to the new channel alone; the report counts %d shadow copies missing (of %d authoritative "+
			"copies, %d checked), want 0", retired, r.Missing, r.Authoritative, r.Checked)
	}
}

// twoChannels makes b's consumer follow plan "move" from b.topic, of
// partitions partitions on cluster A (the old channel), to a new topic of
// one partition on cluster B: a fence of epoch 1 on every partition of
// b.topic names B and the new topic, and one on the new topic names
// b.topic. It returns the new topic.
func (b *bundle) twoChannels(partitions int) string {
	b.t.Helper()
	newTopic := ferrytest.TopicB(b.t, 1)
	ferrytest.CreateTopicB(b.t, newTopic+DeadLetterSuffixDefault, 1)
	for _, side := range []migration.Side{migration.OldSide, migration.NewSide} {
		topic, peer, n, ch := b.topic, newTopic, partitions, migration.Channel{Brokers: ferrytest.BrokersB(b.t), TopicTemplate: "b.{aggregate_type}"}
		if side == migration.NewSide {
			topic, peer, n, ch = newTopic, b.topic, 1, migration.Channel{Brokers: ferrytest.Brokers(b.t), TopicTemplate: "a.{aggregate_type}"}
		}
		value, err := json.Marshal(ch)
		if err != nil {
			b.t.Fatal(err)
		}
		fence := route.Fence{Plan: "move", Epoch: 1, Side: side, Partitions: n, Peer: peer}
		for p := range n {
			b.produceTo(side, &kgo.Record{Topic: topic, Partition: int32(p), Value: value,
				Headers: []kgo.RecordHeader{{Key: route.HeaderFence, Value: []byte(fence.String())}}})
		}
	}
	return newTopic
}

// produceTo produces recs to the cluster of side: A for the old channel,
// B for the new one, to the partitions they name.
func (b *bundle) produceTo(side migration.Side, recs ...*kgo.Record) {
	b.t.Helper()
	if side == migration.OldSide {
		b.produce(recs...)
		return
	}
	cl := ferrytest.ClientB(b.t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl.ProduceSync(b.ctx, recs...).FirstErr(); err != nil {
		b.t.Fatalf("produce to B: %v", err)
	}
}

// copyOf is a stamped copy of event id with key on topic's partition: of
// plan "move", epoch epoch, from side in role.
func (b *bundle) copyOf(topic string, partition int32, id, key string, side migration.Side, role route.Role, epoch int) *kgo.Record {
	r := b.record(id, key, partition, 1)
	r.Topic = topic
	st := route.Stamp{Plan: "move", Epoch: epoch, Slice: route.Slice(r.Key), Side: side, Role: role}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: route.HeaderRoute, Value: []byte(st.String())})
	return r
}

// keyOn returns a key the relay's partitioner sends to partition of a
// topic of n partitions.
func keyOn(t *testing.T, partition, n int) string {
	t.Helper()
	tp := kgo.StickyKeyPartitioner(nil).ForTopic("any")
	for i := range 10_000 {
		k := fmt.Sprintf("k-%d", i)
		if tp.Partition(&kgo.Record{Key: []byte(k)}, n) == partition {
			return k
		}
	}
	t.Fatalf("no key for partition %d of %d", partition, n)
	return ""
}

// quarantinedIDs are the ids in b's consumer's migration quarantine.
func (b *bundle) quarantinedIDs() []string {
	b.t.Helper()
	q, err := ListMigrationQuarantined(b.ctx, b.db.Pool, b.consumer)
	if err != nil {
		b.t.Fatal(err)
	}
	ids := make([]string, len(q))
	for i, e := range q {
		ids[i] = e.ID
	}
	slices.Sort(ids)
	return ids
}

// The migration quarantine means "will not come": an event whose
// authoritative copy waits, unconsumed, on a partition where the group
// lags stays out of it however old its shadow; one whose authoritative
// copy is not on its partition, where the group consumed everything, goes
// in. Issue 21 item 3: the quarantine judged by the shadow's age alone, and
// quarantined a lagging group's not yet consumed copies as never applied
// (96,159 in a run with a 2-minute delay, every one applied later).
func TestALaggingGroupsAuthoritativeCopyIsNotQuarantined(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	newTopic := b.twoChannels(2)
	kLate, kLost := keyOn(t, 0, 2), keyOn(t, 1, 2)
	// Partition 0 lags: a message before m-late's authoritative copy is
	// held by its handler. Partition 1 holds nothing after its fence:
	// m-lost's authoritative copy never came.
	b.produce(b.record("m-block", kLate, 0, 1),
		b.copyOf(b.topic, 0, "m-late", kLate, migration.OldSide, route.Authoritative, 1))
	b.produceTo(migration.NewSide, b.copyOf(newTopic, 0, "m-late", kLate, migration.NewSide, route.Shadow, 1),
		b.copyOf(newTopic, 0, "m-lost", kLost, migration.NewSide, route.Shadow, 1))
	cfg := b.config()
	cfg.MigrationReportInterval = 50 * time.Millisecond
	cfg.MigrationQuarantineAfter = 200 * time.Millisecond
	var passes atomic.Int64
	cfg.hooks.quarantined = func() { passes.Add(1) }
	release := make(chan struct{})
	w := b.newWorker(cfg, func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if m.ID == "m-block" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return effectHandler(ctx, tx, m)
	})
	b.start(w)

	b.waitFor("m-lost quarantined", func() (bool, error) { return slices.Contains(b.quarantinedIDs(), "m-lost"), nil })
	// More passes, m-late's shadow older than the delay all along.
	n := passes.Load()
	b.waitFor("three more passes of the quarantine", func() (bool, error) { return passes.Load() >= n+3, nil })
	if ids := b.quarantinedIDs(); !slices.Equal(ids, []string{"m-lost"}) {
		t.Fatalf("quarantined %v while m-late's authoritative copy waits on partition 0, where the group lags; want m-lost alone", ids)
	}
	close(release)
	b.waitFor("m-late applied", func() (bool, error) { return b.effects("m-late") == 1, nil })
	n = passes.Load()
	b.waitFor("three more passes of the quarantine", func() (bool, error) { return passes.Load() >= n+3, nil })
	if ids := b.quarantinedIDs(); !slices.Equal(ids, []string{"m-lost"}) || b.effects("m-late") != 1 {
		t.Fatalf("quarantine %v and m-late applied %d times once the group caught up; want m-lost alone, m-late once", ids, b.effects("m-late"))
	}
}

// The fences tell where an event's authoritative copy would be: before the
// first fence of a later step on its partition. Once the group passed one
// there, an event never applied will not come, whatever the clock says
// (MigrationQuarantineAfter is an hour here); before, it may.
func TestAShadowIsQuarantinedOnceTheGroupPassedALaterFence(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	newTopic := b.twoChannels(1)
	b.produce(b.stamped("m-lost", migration.OldSide, route.Shadow))
	cfg := b.config()
	cfg.MigrationReportInterval = 50 * time.Millisecond
	cfg.MigrationQuarantineAfter = time.Hour
	cfg.MigrationAllowedLateness = 100 * time.Millisecond // m-lost is located once its copy is late
	var passes atomic.Int64
	cfg.hooks.quarantined = func() { passes.Add(1) }
	w := b.newWorker(cfg, effectHandler)
	b.start(w)

	b.waitFor("m-lost's shadow recorded", func() (bool, error) {
		return b.count(`SELECT count(*) FROM ferry_inbox_copy WHERE message_id = 'm-lost'`) == 1, nil
	})
	n := passes.Load()
	b.waitFor("three more passes of the quarantine", func() (bool, error) { return passes.Load() >= n+3, nil })
	if ids := b.quarantinedIDs(); len(ids) != 0 {
		t.Fatalf("quarantined %v before the group passed a later fence where m-lost's authoritative copy would be", ids)
	}
	value, err := json.Marshal(migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "a.{aggregate_type}"})
	if err != nil {
		t.Fatal(err)
	}
	fence := route.Fence{Plan: "move", Epoch: 2, Side: migration.NewSide, Partitions: 1, Peer: b.topic}
	b.produceTo(migration.NewSide, &kgo.Record{Topic: newTopic, Partition: 0, Value: value,
		Headers: []kgo.RecordHeader{{Key: route.HeaderFence, Value: []byte(fence.String())}}})
	b.waitFor("m-lost quarantined", func() (bool, error) { return slices.Equal(b.quarantinedIDs(), []string{"m-lost"}), nil })
}

// declareRabbit declares consumer's topology of topic on the stack's
// RabbitMQ, with the default shards, and removes it after the test.
func declareRabbit(t *testing.T, consumer, topic string) {
	t.Helper()
	cfg := rabbitConfig(t)
	cfg.Shards = rabbitmq.ShardsDefault
	if _, err := DeclareRabbitMQ(ferrytest.Context(t, time.Minute), &cfg, consumer, []string{topic}); err != nil {
		t.Fatal(err)
	}
	b := &rbundle{rcfg: cfg, topic: topic, consumer: consumer}
	t.Cleanup(b.deleteTopology)
}

// A shadow copy's authoritative copy is located where the relay wrote it:
// on a Kafka channel the partition its key hashes to (murmur2), on a
// RabbitMQ channel its aggregate's shard. Located by the Kafka hash on a
// RabbitMQ channel, a later fence passed on another shard would
// quarantine an event whose copy is still on its way, and one passed on
// its own shard would not.
func TestShadowsAreLocatedOnTheAuthoritativeChannelsPartition(t *testing.T) {
	t.Parallel()
	for _, kind := range []migration.Kind{migration.Kafka, migration.RabbitMQ} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			ch := migration.Channel{Kind: kind, Brokers: []string{"b:9092"}, TopicTemplate: "new.{aggregate_type}"}
			if kind == migration.RabbitMQ {
				ch = migration.Channel{Kind: kind, URL: "amqp://u@mq:5672/", TopicTemplate: "new.{aggregate_type}", Shards: 16}
			}
			value, _ := json.Marshal(ch)
			if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_channel (consumer, plan, side, topic, peer, channel)
				VALUES ($1, 'move', 'old', $2, 'new.order', $3)`, b.consumer, b.topic, value); err != nil {
				t.Fatal(err)
			}
			if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_fence (consumer, plan, side, topic, partition, epoch, partitions)
				VALUES ($1, 'move', 'new', 'new.order', 0, 1, 16)`, b.consumer); err != nil {
				t.Fatal(err)
			}
			var keys []string
			for i := range 32 {
				keys = append(keys, fmt.Sprintf("agg-%d", i))
			}
			if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest,
				received_at, topic, partition, record_offset, record_key)
				SELECT $1, 'id-' || k, 'move', 'old', 'shadow', 1, '\x01', now() - interval '1 hour', $2, 0, 0, convert_to(k, 'UTF8')
				FROM unnest($3::text[]) k`,
				b.consumer, b.topic, keys); err != nil {
				t.Fatal(err)
			}
			w := b.newWorker(b.config(), effectHandler)
			if err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
				_, err := w.locateShadows(b.ctx, tx, b.consumer, shadowScan{})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			differ := 0
			for _, k := range keys {
				var topic string
				var got int32
				if err := b.db.Pool.QueryRow(b.ctx, `SELECT auth_topic, auth_partition FROM ferry_inbox_copy WHERE consumer = $1 AND message_id = $2`,
					b.consumer, "id-"+k).Scan(&topic, &got); err != nil {
					t.Fatalf("%s: %v", k, err)
				}
				want := keyPartition([]byte(k), 16)
				if kind == migration.RabbitMQ {
					want = int32(rabbitmq.Shard([]byte(k), 16))
				}
				if keyPartition([]byte(k), 16) != int32(rabbitmq.Shard([]byte(k), 16)) {
					differ++
				}
				if topic != "new.order" || got != want {
					t.Errorf("%s located on %s partition %d, want new.order partition %d", k, topic, got, want)
				}
			}
			if differ == 0 {
				t.Fatal("no key whose Kafka partition and RabbitMQ shard differ: the test tells nothing")
			}
		})
	}
}

// learnedMove records that b's consumer follows plan "move" from b.topic
// (on the old channel, one partition: a fence passed there) to new.order.
func (b *bundle) learnedMove() {
	b.t.Helper()
	ch, _ := json.Marshal(migration.Channel{Brokers: []string{"b:9092"}, TopicTemplate: "new.{aggregate_type}"})
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_channel (consumer, plan, side, topic, peer, channel)
		VALUES ($1, 'move', 'old', $2, 'new.order', $3)`, b.consumer, b.topic, ch); err != nil {
		b.t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_fence (consumer, plan, side, topic, partition, epoch, partitions)
		VALUES ($1, 'move', 'old', $2, 0, 1, 1)`, b.consumer, b.topic); err != nil {
		b.t.Fatal(err)
	}
}

// quarantineScanReads runs w's next quarantine pass's scan, as a pass
// does (from where its worker's last pass left, or a restarted worker's
// from ferry_inbox_shadow_scan), and returns how many rows and index
// entries of ferry_inbox_copy and inbox it read, and the partitions it
// awaits.
func (b *bundle) quarantineScanReads(w *Worker) (read int64, awaited int) {
	b.t.Helper()
	const readSQL = `SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid)), 0)::bigint FROM pg_class c
		WHERE c.oid IN ('ferry_inbox_copy'::regclass, 'inbox'::regclass)
		   OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid IN ('ferry_inbox_copy'::regclass, 'inbox'::regclass))`
	if _, ok := w.shadowScans[b.consumer]; !ok {
		w.shadowScans[b.consumer] = w.loadShadowScan(b.ctx, b.consumer)
	}
	var scan shadowScan
	if err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		var before, after int64
		if err := tx.QueryRow(b.ctx, readSQL).Scan(&before); err != nil {
			return err
		}
		rows, next, err := w.quarantineScan(b.ctx, tx, b.consumer)
		if err != nil {
			return err
		}
		scan = next
		if err := tx.QueryRow(b.ctx, readSQL).Scan(&after); err != nil {
			return err
		}
		read, awaited = after-before, len(rows)
		return nil
	}); err != nil {
		b.t.Fatal(err)
	}
	w.shadowScans[b.consumer] = w.saveShadowScan(b.ctx, b.consumer, scan) // committed, as the pass does
	return read, awaited
}

// A quarantine pass reads the shadows recorded since the pass before it,
// not every shadow of the migration: a shadow whose event is applied is
// read by one pass, and the shadows awaiting their authoritative copy are
// found by an index of their own. Before, every pass (every
// MigrationReportInterval) read each shadow the consumer ever recorded, to
// locate and to await them: a pass cost more the longer the migration ran,
// and a worker in DUAL_WRITE applied 0.36-0.49 of its OLD_ONLY rate
// 300,000 messages in, against 0.71 100,000 in.
func TestAQuarantinePassReadsOnlyTheShadowsSinceTheLastOne(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.learnedMove()
	shadows := func(from, to int, applied bool) {
		t.Helper()
		if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest,
			received_at, topic, partition, record_offset, record_key)
			SELECT $1, 'id-' || i, 'move', 'new', 'shadow', 1, '\x01', now() - interval '1 hour', 'new.order', 0, i, '\x6b'
			FROM generate_series($2::int, $3::int) i`, b.consumer, from, to); err != nil {
			t.Fatal(err)
		}
		if applied {
			if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO inbox (consumer, message_id)
				SELECT $1, 'id-' || i FROM generate_series($2::int, $3::int) i`, b.consumer, from, to); err != nil {
				t.Fatal(err)
			}
		}
	}
	const settled = 3000
	shadows(1, settled, true)
	shadows(settled+1, settled+1, false)
	w := b.newWorker(b.config(), effectHandler)
	pass := func() (read int64, awaited int) { return b.quarantineScanReads(w) }
	// As on a busy database: the tables analyzed (a few rows since the
	// last pass, in tables this small, and the planner hashed the whole
	// inbox), and transactions running anywhere at the first pass's
	// horizon, whose copies the second pass reads by transaction id.
	if _, err := b.db.Pool.Exec(b.ctx, "ANALYZE ferry_inbox_copy, inbox"); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		c, err := pgx.Connect(b.ctx, b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		if _, err := c.Exec(b.ctx, "BEGIN; SELECT pg_current_xact_id()"); err != nil {
			t.Fatal(err)
		}
	}
	read, awaited := pass()
	t.Logf("the first pass read %d rows and index entries", read)
	if read < settled || awaited != 1 {
		t.Fatalf("the first pass read %d rows and index entries and awaits %d partitions, want at least %d (every shadow, once) and 1",
			read, awaited, settled)
	}
	shadows(settled+2, settled+2, false)
	read, awaited = pass()
	t.Logf("the second pass read %d rows and index entries", read)
	if read > 100 || awaited != 1 {
		t.Fatalf("the second pass read %d rows and index entries and awaits %d partitions, want at most 100 "+
			"(%d shadows applied before the first pass were read again?) and 1", read, awaited, settled)
	}
	var located int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM ferry_inbox_copy WHERE consumer = $1 AND auth_partition IS NOT NULL`,
		b.consumer).Scan(&located); err != nil {
		t.Fatal(err)
	}
	if located != 2 {
		t.Fatalf("%d shadows located, want the 2 never applied", located)
	}

	// A restarted worker (or another instance of the group) reads from
	// where the last pass left (ferry_inbox_shadow_scan), with the shadows
	// that pass was waiting for, not from the migration's first shadow.
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest,
		received_at, topic, partition, record_offset, record_key)
		VALUES ($1, 'waiting', 'move', 'new', 'shadow', 1, '\x01', now(), 'new.order', 0, 0, '\x6b')`, b.consumer); err != nil {
		t.Fatal(err)
	}
	if _, awaited = pass(); awaited != 1 {
		t.Fatalf("the third pass awaits %d partitions, want 1", awaited)
	}
	restarted := b.newWorker(b.config(), effectHandler)
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE ferry_inbox_copy SET received_at = now() - interval '1 hour'
		WHERE consumer = $1 AND message_id = 'waiting'`, b.consumer); err != nil { // late now
		t.Fatal(err)
	}
	read, _ = b.quarantineScanReads(restarted)
	t.Logf("a restarted worker's first pass read %d rows and index entries", read)
	if read > 100 {
		t.Fatalf("a restarted worker's first pass read %d rows and index entries, want at most 100 "+
			"(every shadow of the migration read again?)", read)
	}
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM ferry_inbox_copy WHERE consumer = $1 AND auth_partition IS NOT NULL`,
		b.consumer).Scan(&located); err != nil {
		t.Fatal(err)
	}
	if located != 3 {
		t.Fatalf("%d shadows located after the restart, want 3: the one the last pass was waiting for was not read again", located)
	}
}

// A consumer that follows no plan has no shadow: its passes record
// nothing in ferry_inbox_shadow_scan (a worker without a migration
// writes no row every MigrationReportInterval, nor needs the grants).
func TestAPassWithoutAMigrationRecordsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	w := b.newWorker(b.config(), effectHandler)
	b.quarantineScanReads(w)
	b.quarantineScanReads(w)
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM ferry_inbox_shadow_scan`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows in ferry_inbox_shadow_scan for a consumer without a migration, want none", n)
	}
}

// A shadow whose authoritative copy is on a RabbitMQ channel, where the
// quarantine cannot read the group's position, is never left behind
// silently: once it waited longer than the quarantine waits, the group's
// report counts its shard queue as unwatched and the drain refuses
// OLD_RETIRED, saying what to do; once its event is applied, the count is
// gone. Before, nothing counted it: with the copy lost in the last step's
// epoch (no later fence to tell), OLD_RETIRED could pass without it.
func TestAShadowAwaitingRabbitMQBlocksTheDrain(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ch, _ := json.Marshal(migration.Channel{Kind: migration.RabbitMQ, URL: "amqp://u@127.0.0.1:1/", TopicTemplate: "new.{aggregate_type}", Shards: 16})
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_channel (consumer, plan, side, topic, peer, channel)
		VALUES ($1, 'move', 'old', $2, 'new.order', $3)`, b.consumer, b.topic, ch); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_fence (consumer, plan, side, topic, partition, epoch, partitions)
		VALUES ($1, 'move', 'new', 'new.order', 0, 2, 16)`, b.consumer); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO ferry_inbox_copy (consumer, message_id, plan, side, role, epoch, digest,
		received_at, topic, partition, record_offset, record_key)
		VALUES ($1, 'lost-1', 'move', 'old', 'shadow', 2, '\x01', now(), $2, 0, 0, 'agg-1')`, b.consumer, b.topic); err != nil {
		t.Fatal(err)
	}
	cfg := b.config()
	cfg.MigrationReportInterval = 50 * time.Millisecond
	cfg.MigrationQuarantineAfter = 200 * time.Millisecond
	b.start(b.newWorker(cfg, effectHandler))
	ev := &migration.ReportEvidence{MaxAge: time.Minute}
	b.waitFor("the drain to refuse over the unwatched shadow", func() (bool, error) {
		err := ev.Drained(b.ctx, b.movePlan(), b.consumer, 0)
		return err != nil && strings.Contains(err.Error(), "on 1 partitions or shard queues its shadow copies wait"), nil
	})
	if n := b.count(`SELECT count(*) FROM ferry_inbox_quarantine`); n != 0 {
		t.Fatalf("%d events quarantined: no position nor fence says the copy was lost", n)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO inbox (consumer, message_id) VALUES ($1, 'lost-1')`, b.consumer); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the drain to stop counting the applied event", func() (bool, error) {
		err := ev.Drained(b.ctx, b.movePlan(), b.consumer, 0)
		return err == nil || !strings.Contains(err.Error(), "shadow copies wait"), nil
	})
}

// A producer that is not Ferry's on a RabbitMQ old channel is visible
// before OLD_RETIRED: the worker counts what it consumes by the user id
// the broker validated and reports it, and the controller's evidence sums
// the reports of the window: the relay's user, and the other user that
// published to the old exchange.
func TestAForeignProducerOnRabbitMQIsSeen(t *testing.T) {
	t.Parallel()
	m := setupLiveMigrationKinds(t, 2*time.Minute, migration.RabbitMQ, migration.Kafka)
	cfg := m.workerConfig()
	cfg.MigrationReportInterval = 100 * time.Millisecond
	m.startEffects(cfg)
	m.request(migration.DualWrite, 0)
	stop := make(chan struct{})
	errs := m.writeUntil(stop)
	m.afterMore(20)
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}

	foreign, err := amqp.Dial(ferrytest.RabbitMQRelayURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	ch, err := foreign.Channel()
	if err != nil {
		t.Fatal(err)
	}
	user := os.Getenv(ferrytest.EnvRabbitMQRelayUser)
	rk, pub, err := rabbitmq.Publishing(&kgo.Record{Topic: m.oldTopic, Key: []byte("foreign-1"), Value: []byte("1"),
		Headers: []kgo.RecordHeader{{Key: outbox.HeaderID, Value: []byte("foreign-msg-1")}}}, rabbitmq.ShardsDefault, user, rabbitmq.MaxMessageBytesDefault)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(m.ctx, m.oldTopic, rk, true, false, pub); err != nil {
		t.Fatal(err)
	}
	ev := &migration.ReportEvidence{MaxAge: time.Minute}
	relayUser := ""
	if u, err := url.Parse(m.rabbitOld.URL); err == nil {
		relayUser = u.User.Username()
	}
	m.waitFor("both producers seen", func() (bool, error) {
		seen, err := ev.SeenProducers(m.ctx, migration.Plan{Name: "move", Old: m.oldChannel}, time.Hour)
		if err != nil {
			return false, err
		}
		users := map[string]int64{}
		for _, ps := range seen {
			if ps.Topic == m.oldTopic {
				users[ps.User] += ps.Records
			}
		}
		return users[user] == 1 && users[relayUser] >= 20, nil
	})
}

// A worker whose own channel is RabbitMQ follows a Kafka new channel with
// the client settings in its KafkaOpts (here the session timeout), the
// plan's brokers and security: before, it had none to give, and a worker
// killed there kept its partitions for franz-go's default 45 s.
func TestARabbitMQWorkerFollowsKafkaWithItsClientSettings(t *testing.T) {
	t.Parallel()
	m := setupLiveMigrationKinds(t, 2*time.Minute, migration.RabbitMQ, migration.Kafka)
	cfg := m.workerConfig()
	cfg.KafkaOpts = []kgo.Opt{kgo.SessionTimeout(7 * time.Second), kgo.HeartbeatInterval(time.Second)}
	w := m.startEffects(cfg)
	m.request(migration.DualWrite, 0)
	var f *groupConsumer
	m.waitFor("the worker to follow the new channel", func() (bool, error) {
		f = w.follower(m.consumer, "move")
		return f != nil, nil
	})
	cl := f.kafka()
	if v := cl.OptValue(kgo.SessionTimeout); v != 7*time.Second {
		t.Errorf("the new channel's session timeout is %v, want the worker's 7s", v)
	}
	if seeds, _ := cl.OptValue(kgo.SeedBrokers).([]string); !slices.Equal(seeds, ferrytest.BrokersB(t)) {
		t.Errorf("the new channel's seed brokers are %v, want the plan's %v", seeds, ferrytest.BrokersB(t))
	}
}

// startEffects runs a worker of cfg for m's consumer, each message of the
// old topic (or its peer on the new channel) an effect row tagged with
// the topic it came from, until the test ends.
func (m *liveMigration) startEffects(cfg *Config) *Worker {
	m.t.Helper()
	w, err := New(cfg)
	if err != nil {
		m.t.Fatal(err)
	}
	w.Handle(m.consumer, m.oldTopic, func(ctx context.Context, tx pgx.Tx, msg *Message) error {
		return insertEffect(ctx, tx, msg, msg.Topic)
	})
	m.start(w)
	return w
}
