package demo

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/procs"
	"github.com/ferryhq/ferry/internal/rabbitmq"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/schema"
)

// migrationDatabase is the migration demo's own database, recreated at
// every run, beside make demo's.
const migrationDatabase = "reserva_migration_demo"

// migrationSlot is the relay's replication slot: slots are named per
// PostgreSQL cluster, so not make demo's "ferry".
const migrationSlot = "reserva_migration_demo"

// oldTemplate is the relay's topic template (its default), the plan's old
// channel on cluster A.
const oldTemplate = "outbox.event.{aggregate_type}"

// oldPartitions is how many partitions the topics have on cluster A, as in
// make demo.
const oldPartitions = 4

// migrationOptions are the flags of `reserva demo-migration`.
type migrationOptions struct {
	// from is where reserva starts: brokerKafka (cluster A) or
	// brokerRabbitMQ (the stack's RabbitMQ, with a foreign producer).
	from          string
	foreignRate   int
	bridgeAddr    string
	brokersB      string
	newTemplate   string
	newPartitions int
	notes         int
	stepPause     time.Duration
	gateTimeout   time.Duration
	gateMax       time.Duration
	drainTimeout  time.Duration
	reportEvery   time.Duration
	quarantine    time.Duration
}

// migrationDemo moves reserva, live, from Kafka cluster A (or RabbitMQ) to
// cluster B: the processes of make demo, orders placed at a steady pace the
// whole time, and the plan driven through the real `relay migration`
// commands. From RabbitMQ, a producer that is not Ferry's publishes to the
// old channel the whole time too, and `relay bridge` copies it to cluster B.
type migrationDemo struct {
	*demo
	mo   migrationOptions
	plan string
	bins map[string]string
	env  []string
	// kopts reach cluster A, koptB cluster B.
	kopts, koptB []kgo.Opt
	// rabbit is the old channel with --from rabbitmq; nil from cluster A.
	rabbit *rabbitChannel
	// foreign is the producer that is not Ferry's, bridge the `relay
	// bridge` that copies it, ready since bridgeReady (--from rabbitmq).
	foreign     *foreignProducer
	bridge      *procs.Proc
	bridgeReady time.Time
	// planDef is the plan as created, for the gate reports.
	planDef migration.Plan
	// phase is the plan's phase as the progress lines show it.
	phase string
	// placeDone is closed when placeOrders returned placeErr.
	placeDone chan struct{}
	placeErr  error
	// requests are the `relay migration request` commands run, in order.
	requests []request
	notes    noteWriter
	// retiredAt is when OLD_RETIRED was accepted; zero until then.
	retiredAt time.Time
}

func runMigrationDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reserva demo-migration", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var mo migrationOptions
	fs.StringVar(&o.adminURL, "admin-url", cmp.Or(os.Getenv("FERRY_TEST_DATABASE_URL"), os.Getenv("FERRY_DATABASE_URL")), "PostgreSQL URL of a role that may create the demo's database "+migrationDatabase+" (env FERRY_TEST_DATABASE_URL)")
	fs.StringVar(&mo.from, "from", brokerKafka, "where reserva starts: kafka (cluster A) or rabbitmq (the stack's RabbitMQ, with a producer that is not Ferry's, bridged by relay bridge); it moves to cluster B")
	fs.StringVar(&o.brokers, "kafka-brokers", cmp.Or(os.Getenv("FERRY_TEST_KAFKA_BROKERS"), os.Getenv("FERRY_KAFKA_BROKERS")), "cluster A's seed brokers, where reserva starts (env FERRY_TEST_KAFKA_BROKERS)")
	fs.StringVar(&o.rabbitURL, "rabbitmq-url", cmp.Or(os.Getenv("FERRY_TEST_RABBITMQ_URL"), os.Getenv("FERRY_RABBITMQ_URL")), "with --from rabbitmq: amqp://user@host:port/vhost, no password in it; the password comes from FERRY_TEST_RABBITMQ_PASSWORD or FERRY_RABBITMQ_PASSWORD only (env FERRY_TEST_RABBITMQ_URL)")
	fs.IntVar(&mo.foreignRate, "foreign-rate", 10, "with --from rabbitmq: messages a second the producer that is not Ferry's publishes to RabbitMQ, from start to end")
	fs.StringVar(&mo.brokersB, "kafka-b-brokers", os.Getenv("FERRY_TEST_KAFKA_B_BROKERS"), "cluster B's seed brokers, where reserva moves (env FERRY_TEST_KAFKA_B_BROKERS)")
	fs.StringVar(&mo.newTemplate, "new-topic-template", "reserva.v2.{aggregate_type}", "the topic template on cluster B")
	fs.IntVar(&mo.newPartitions, "new-partitions", 8, fmt.Sprintf("partitions of the new topics (cluster A's have %d: the move re-keys them)", oldPartitions))
	fs.StringVar(&o.binDir, "bin-dir", "", "directory holding the relay, reserva-worker and reserva binaries; empty builds them")
	fs.IntVar(&o.rate, "rate", 50, "orders placed a second, at a steady pace, from start to end")
	fs.IntVar(&o.clients, "clients", 8, "most orders in flight at once")
	fs.IntVar(&mo.notes, "notes", 32, "orders that get an OrderNoted event every second for the whole run, so that an aggregate's events straddle every step; 0: none")
	fs.DurationVar(&mo.stepPause, "step-pause", 6*time.Second, "orders flowing between two steps of the plan")
	fs.DurationVar(&mo.gateTimeout, "gate-timeout", time.Minute, "give up when a closed gate's reason stood still (same figures) for this long")
	fs.DurationVar(&mo.gateMax, "gate-max", 10*time.Minute, "give up when a gate is still closed after this long, even while its figures move")
	fs.DurationVar(&mo.drainTimeout, "drain-timeout", 90*time.Second, "give up when the events are not all applied this long after the last order")
	fs.DurationVar(&mo.reportEvery, "migration-report-interval", time.Second, "the workers' --migration-report-interval: how often their shadow reports reach the gates")
	fs.DurationVar(&mo.quarantine, "migration-quarantine-after", 30*time.Second, "the workers' --migration-quarantine-after")
	fs.BoolVar(&o.once, "once", false, "exit after the summary, instead of running until Ctrl-C")
	fs.StringVar(&o.apiAddr, "api-addr", "127.0.0.1:8091", "order API address")
	fs.StringVar(&o.relayAddr, "relay-http", "127.0.0.1:9191", "relay metrics address")
	fs.StringVar(&o.workerAddrs[0], "worker-http", "127.0.0.1:9192", "first worker's metrics address")
	fs.StringVar(&o.workerAddrs[1], "worker2-http", "127.0.0.1:9193", "second worker's metrics address")
	fs.StringVar(&mo.bridgeAddr, "bridge-http", "127.0.0.1:9194", "with --from rabbitmq: relay bridge's metrics address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case o.adminURL == "":
		return errors.New("--admin-url (FERRY_TEST_DATABASE_URL) is required: run it through `make demo-migration`, or after `eval \"$(scripts/stack up)\"`")
	case mo.from != brokerKafka && mo.from != brokerRabbitMQ:
		return fmt.Errorf("--from must be %s or %s, not %q", brokerKafka, brokerRabbitMQ, mo.from)
	case mo.from == brokerKafka && o.brokers == "":
		return errors.New("--kafka-brokers (FERRY_TEST_KAFKA_BROKERS) is required")
	case mo.from == brokerRabbitMQ && o.rabbitURL == "":
		return errors.New("--rabbitmq-url (FERRY_TEST_RABBITMQ_URL) is required with --from rabbitmq: run it through `make demo-migration`, or after `eval \"$(scripts/stack up)\"`")
	case mo.from == brokerRabbitMQ && (mo.foreignRate < 1 || mo.foreignRate > rateMax):
		return fmt.Errorf("--foreign-rate must be between 1 and %d messages a second, not %d", rateMax, mo.foreignRate)
	case mo.brokersB == "":
		return errors.New("--kafka-b-brokers (FERRY_TEST_KAFKA_B_BROKERS) is required: the stack's cluster B (`scripts/stack env`)")
	case !strings.Contains(mo.newTemplate, "{aggregate_type}"):
		return fmt.Errorf("--new-topic-template %q must contain {aggregate_type}", mo.newTemplate)
	case mo.newPartitions < 1:
		return fmt.Errorf("--new-partitions must be positive, not %d", mo.newPartitions)
	case o.rate < 1 || o.rate > rateMax:
		return fmt.Errorf("--rate must be between 1 and %d orders a second, not %d", rateMax, o.rate)
	case o.clients < 1:
		return fmt.Errorf("--clients must be positive, not %d", o.clients)
	case mo.notes < 0:
		return fmt.Errorf("--notes must be 0 or more, not %d", mo.notes)
	case mo.stepPause <= 0 || mo.gateTimeout <= 0 || mo.gateMax <= 0 || mo.drainTimeout <= 0 || mo.reportEvery <= 0 || mo.quarantine <= 0:
		return errors.New("--step-pause, --gate-timeout, --gate-max, --drain-timeout, --migration-report-interval and --migration-quarantine-after must be positive")
	}
	// placeOrders sends o.orders orders: more than the run can place, so
	// that the demo stops it.
	o.orders = o.rate * 3600
	o.rabbitPass = cmp.Or(os.Getenv("FERRY_TEST_RABBITMQ_PASSWORD"), os.Getenv("FERRY_RABBITMQ_PASSWORD"))
	start := time.Now()
	m := &migrationDemo{demo: &demo{o: o, out: stdout, start: start}, mo: mo,
		plan: "reserva-move-" + start.UTC().Format("20060102-150405")}
	if mo.from == brokerRabbitMQ {
		m.rabbit = &rabbitChannel{cfg: inbox.RabbitMQConfig{URL: o.rabbitURL, Password: o.rabbitPass, Shards: rabbitmq.ShardsDefault}}
		m.foreign = &foreignProducer{conn: rabbitmq.Conn{URL: o.rabbitURL, Password: o.rabbitPass, Name: "reserva-demo foreign producer"},
			exchange: reserva.TopicOrders, shards: rabbitmq.ShardsDefault, rate: mo.foreignRate}
	}
	defer m.stopAll()
	return m.run(ctx)
}

func (m *migrationDemo) run(ctx context.Context) error {
	var err error
	if m.dir, err = os.MkdirTemp("", "reserva-migration-demo-"); err != nil {
		return err
	}
	m.say("== reserva live broker migration demo: logs in %s", m.dir)
	if err := m.prepare(ctx); err != nil {
		return err
	}
	if err := m.startProcesses(ctx); err != nil {
		return err
	}

	m.say("== %s placing orders through http://%s/orders at %d a second (at most %d in flight) from now to the end",
		m.elapsed(), m.o.apiAddr, m.o.rate, m.o.clients)
	placeCtx, stopPlacing := context.WithCancel(ctx)
	m.placeDone = make(chan struct{})
	go func() {
		m.placeErr = m.placeOrders(placeCtx)
		close(m.placeDone)
	}()
	noting := make(chan error, 1)
	go func() { noting <- m.notes.run(placeCtx, m.pool, m.mo.notes) }()
	publishing := make(chan error, 1)
	if m.foreign != nil {
		go func() { publishing <- m.foreign.run(placeCtx) }()
	} else {
		publishing <- nil
	}
	var notingErr, publishingErr error
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stopPlacing()
			<-m.placeDone
			notingErr = <-noting
			publishingErr = <-publishing
		}
	}
	defer stop() // before the processes and the pool go
	if m.mo.notes > 0 {
		m.say("   and an OrderNoted event every second on each of the first %d orders (their aggregates straddle every step)", m.mo.notes)
	}
	if m.foreign != nil {
		m.say("   and a producer that is not Ferry's publishes %s to the exchange %s at %d a second on %d aggregates, a third with a message id, a third with an id header, a third with no id",
			EventForeignNoted, m.foreign.exchange, m.foreign.rate, foreignAggregates)
	}

	if err := m.migrate(ctx); err != nil {
		return fmt.Errorf("%w (logs in %s)", err, m.dir)
	}

	stop()
	if err := m.placeErr; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if err := notingErr; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if err := publishingErr; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	m.say("== %s orders stopped: %d placed (%d failed to reach the API), %d notes written; waiting for every event to be applied",
		m.elapsed(), m.placed.Load(), m.failed.Load(), m.notes.written.Load())
	if m.foreign != nil {
		m.say("   the foreign producer stopped too, after %d %s: the wait is for each of them too, and for every copy the bridge must have made",
			len(m.foreign.published()), EventForeignNoted)
	}
	drained := m.drain(ctx)
	var bridged bridgeCounts
	if m.bridge != nil {
		if bridged, err = m.stopBridge(); err != nil {
			return err
		}
	}
	failed, err := m.summary(ctx, drained, bridged)
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d checks failed: %s (logs in %s)", len(failed), strings.Join(failed, ", "), m.dir)
	}
	if m.o.once {
		return nil
	}
	keeps := "Everything keeps running on cluster B"
	if m.bridge != nil {
		keeps = "The relay, the workers and the API keep running on cluster B (the foreign producer and the bridge stopped)"
	}
	m.say("\n%s. Try:\n  curl -s http://%s/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: try-1' -d '{\"customer\":\"you\",\"items\":[{\"sku\":\"apple\",\"qty\":1}]}'\n  %s migration status %s   (FERRY_DATABASE_URL: the stack's database %s)\nCtrl-C stops the relay, the workers and the API.",
		keeps, m.o.apiAddr, m.bins["relay"], m.plan, migrationDatabase)
	<-ctx.Done()
	m.say("\n== stopping")
	return nil
}

// elapsed is the time since the start, as the progress lines show it.
func (m *migrationDemo) elapsed() string {
	return fmt.Sprintf("%5.1fs", time.Since(m.start).Seconds())
}

// newTopic is the topic of an aggregate type on cluster B.
func (m *migrationDemo) newTopic(aggregateType string) string {
	return strings.ReplaceAll(m.mo.newTemplate, "{aggregate_type}", aggregateType)
}

// prepare recreates the demo database, migrates it, seeds the stock, and
// makes the topics on both clusters: on B with the new template and more
// partitions, which Kafka cannot give an existing topic's keys in place.
func (m *migrationDemo) prepare(ctx context.Context) error {
	if err := ferrytest.DropDatabase(m.o.adminURL, migrationDatabase); err != nil {
		return err
	}
	url, err := ferrytest.CreateDatabase(ctx, m.o.adminURL, migrationDatabase)
	if err != nil {
		return err
	}
	m.url = url
	if m.pool, err = pgxpool.New(ctx, url); err != nil {
		return err
	}
	db := stdlib.OpenDBFromPool(m.pool)
	defer db.Close()
	if err := schema.Up(ctx, db); err != nil {
		return err
	}
	rm, err := schema.New(db, reserva.Migrations, nil)
	if err != nil {
		return err
	}
	if _, err := rm.Up(ctx); err != nil {
		return err
	}
	if err := relay.Setup(ctx, m.pool, migrationSlot, relay.PublicationDefault, nil); err != nil {
		return err
	}
	if err := reserva.SeedStock(ctx, m.pool, skus); err != nil {
		return err
	}
	m.koptB = []kgo.Opt{kgo.SeedBrokers(strings.Split(m.mo.brokersB, ",")...)}
	oldTopics := []string{reserva.TopicOrders, reserva.TopicStock}
	newTopics := []string{m.newTopic(reserva.AggregateOrder), m.newTopic(reserva.AggregateStock)}
	var stale int64
	if m.rabbit != nil {
		if stale, err = m.prepareRabbitMQ(ctx); err != nil {
			return fmt.Errorf("RabbitMQ: %w", err)
		}
	} else {
		m.kopts = []kgo.Opt{kgo.SeedBrokers(strings.Split(m.o.brokers, ",")...)}
		if err := createTopics(ctx, m.kopts, oldPartitions, oldTopics...); err != nil {
			return fmt.Errorf("cluster A: %w", err)
		}
	}
	if err := createTopics(ctx, m.koptB, int32(m.mo.newPartitions), newTopics...); err != nil {
		return fmt.Errorf("cluster B: %w", err)
	}
	// As in make demo: what an earlier run left on the topics is not this
	// database's (see kafkaChannel.prepare).
	for i, group := range []string{reserva.ConsumerStockReservation, reserva.ConsumerOrderStatus} {
		if m.rabbit == nil {
			n, err := skipToEndOn(ctx, m.kopts, group, oldTopics[i])
			if err != nil {
				return fmt.Errorf("cluster A: %w", err)
			}
			stale += n
		}
		nb, err := skipToEndOn(ctx, m.koptB, group, newTopics[i])
		if err != nil {
			return fmt.Errorf("cluster B: %w", err)
		}
		stale += nb
	}
	m.say("== database %s migrated (Ferry + reserva), stock seeded, slot %q ready", migrationDatabase, migrationSlot)
	if stale > 0 {
		where := "clusters"
		if m.rabbit != nil {
			where = "channels"
		}
		m.say("   %d messages an earlier run left unconsumed on the %s skipped: their orders are not in this database", stale, where)
	}
	if m.rabbit != nil {
		m.say("   RabbitMQ %s: exchanges %s (%d shards each), both consumers' shard queues declared before the relay starts",
			m.rabbit.cfg.URL, strings.Join(oldTopics, ", "), m.rabbit.cfg.Shards)
	} else {
		m.say("   cluster A %s: %s (%d partitions each)", m.o.brokers, strings.Join(oldTopics, ", "), oldPartitions)
	}
	m.say("   cluster B %s: %s (%d partitions each), made before the move", m.mo.brokersB, strings.Join(newTopics, ", "), m.mo.newPartitions)
	return nil
}

// prepareRabbitMQ declares both consumers' shard queues on the old
// RabbitMQ channel before the relay publishes anything (a queue receives
// only what is published after it exists), empties them of what an
// earlier run left, and deletes the bridge's queues an interrupted run
// left. It returns how many messages it dropped.
func (m *migrationDemo) prepareRabbitMQ(ctx context.Context) (int64, error) {
	conn, err := m.rabbit.conn().Dial(rabbitNames)
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	stale, err := m.rabbit.declareQueues(ctx, ch)
	if err != nil {
		return 0, err
	}
	return stale, m.deleteBridgeQueues()
}

// createTopics makes the topics and their dead-letter topics, unless they
// exist.
func createTopics(ctx context.Context, kopts []kgo.Opt, partitions int32, topics ...string) error {
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for _, t := range topics {
		res, err := adm.CreateTopics(ctx, partitions, 1, nil, t, t+".dlq")
		if err != nil {
			return fmt.Errorf("create topics: %w", err)
		}
		for _, r := range res {
			if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
				return fmt.Errorf("create topic %s: %w", r.Topic, r.Err)
			}
		}
	}
	return nil
}

// startProcesses starts what make demo starts, the workers with short
// shadow-report intervals so that the gates open within seconds. From
// RabbitMQ, they get its settings in their environment, as in make demo.
func (m *migrationDemo) startProcesses(ctx context.Context) error {
	m.bins = map[string]string{}
	if m.o.binDir == "" {
		m.say("== building relay, reserva-worker and reserva")
		paths, err := procs.Build(ctx, m.dir, "github.com/ferryhq/ferry/cmd/relay", "github.com/ferryhq/ferry/examples/reserva/cmd/reserva-worker", "github.com/ferryhq/ferry/examples/reserva/cmd/reserva")
		if err != nil {
			return err
		}
		m.bins["relay"], m.bins["reserva-worker"], m.bins["reserva"] = paths[0], paths[1], paths[2]
	} else {
		for _, b := range []string{"relay", "reserva-worker", "reserva"} {
			m.bins[b] = filepath.Join(m.o.binDir, b)
		}
	}
	m.env = []string{"FERRY_DATABASE_URL=" + m.url, "FERRY_KAFKA_BROKERS=" + m.o.brokers}
	workerArgs := []string{"--kafka-session-timeout", "6s"}
	if m.rabbit != nil {
		// No Kafka brokers: the relay and the workers take one channel.
		m.env = append([]string{"FERRY_DATABASE_URL=" + m.url, "FERRY_KAFKA_BROKERS="}, m.rabbit.env()...)
		// The foreign producer's messages with no id get the one the
		// bridge gives their copies. The drain of a RabbitMQ old channel
		// waits until it brought nothing to apply for the longest retry
		// backoff plus the handler timeout (90s by default): reserva's
		// handlers take milliseconds, and --max-attempts 5 from 50ms backs
		// off 400ms at most.
		workerArgs = []string{"--id-from-payload-hash", "--retry-backoff-max", "1s", "--handler-timeout", "10s"}
	}
	env := append(m.env[:len(m.env):len(m.env)], "FERRY_LOG_FORMAT=json")
	start := func(name, bin string, args ...string) (*procs.Proc, error) {
		return procs.Start(procs.Spec{Name: name, Path: bin, Args: args, Env: env, LogFile: filepath.Join(m.dir, name+".log")})
	}
	var err error
	if m.relay, err = start("relay", m.bins["relay"], "run", "--http-addr", m.o.relayAddr, "--slot", migrationSlot, "--topic-template", oldTemplate); err != nil {
		return err
	}
	for i := range m.workers {
		args := append([]string{"run", "--http-addr", m.o.workerAddrs[i], "--retry-backoff", "50ms", "--max-attempts", "5"}, workerArgs...)
		args = append(args, "--migration-report-interval", m.mo.reportEvery.String(), "--migration-quarantine-after", m.mo.quarantine.String())
		if m.workers[i], err = start(fmt.Sprintf("worker-%d", i+1), m.bins["reserva-worker"], args...); err != nil {
			return err
		}
	}
	if m.api, err = start("api", m.bins["reserva"], "api", "--addr", m.o.apiAddr); err != nil {
		return err
	}
	for _, u := range []string{"http://" + m.o.relayAddr + "/readyz", "http://" + m.o.workerAddrs[0] + "/readyz", "http://" + m.o.workerAddrs[1] + "/readyz", "http://" + m.o.apiAddr + "/healthz"} {
		if err := waitHTTP(ctx, u, time.Minute); err != nil {
			return fmt.Errorf("%w (logs in %s)", err, m.dir)
		}
	}
	if m.rabbit != nil {
		m.say("== relay (topic template %s on RabbitMQ, %d shards), 2 reserva-workers on RabbitMQ (--id-from-payload-hash, --migration-report-interval %s) and the order API are up",
			oldTemplate, m.rabbit.cfg.Shards, m.mo.reportEvery)
		return nil
	}
	m.say("== relay (topic template %s on cluster A), 2 reserva-workers (--migration-report-interval %s) and the order API are up",
		oldTemplate, m.mo.reportEvery)
	return nil
}
