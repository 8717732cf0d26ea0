package inbox

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/outbox"
)

// Defaults of Config.
const (
	ConcurrencyDefault                  = 8
	KeyConcurrencyDefault               = 1
	BatchSizeDefault                    = 16
	MaxAttemptsDefault                  = 10
	RetryBackoffDefault                 = 200 * time.Millisecond
	RetryBackoffMaxDefault              = 30 * time.Second
	HandlerTimeoutDefault               = time.Minute
	DrainTimeoutDefault                 = 15 * time.Second
	CommitIntervalDefault               = time.Second
	HealthTimeoutDefault                = 2 * time.Minute
	MaxBufferedBytesPerPartitionDefault = 4 << 20
	DeadLetterSuffixDefault             = ".dlq"
	OffsetResetDefault                  = OffsetResetEarliest
	MigrationReportIntervalDefault      = 10 * time.Second
	MigrationAllowedLatenessDefault     = 30 * time.Second
	MigrationReportWindowDefault        = 2 * time.Minute
	MigrationQuarantineAfterDefault     = 5 * time.Minute
)

// OffsetReset says where a consumer starts reading a partition for which its
// group has no committed offset: a new consumer, or a partition added to a
// topic. The names follow Kafka's auto.offset.reset.
type OffsetReset string

const (
	// OffsetResetEarliest reads the partition from its first retained
	// record. Nothing is skipped; what was already applied is deduplicated
	// by the inbox. The default.
	OffsetResetEarliest OffsetReset = "earliest"
	// OffsetResetLatest starts after the last record: what was written
	// before the consumer joined is never applied.
	OffsetResetLatest OffsetReset = "latest"
	// OffsetResetNone refuses to consume a partition that has no committed
	// offset; the worker logs an error for it and consumes the others.
	OffsetResetNone OffsetReset = "none"
)

// Config configures a Worker. DB and one of KafkaOpts and RabbitMQ are
// required.
type Config struct {
	// DB begins the transactions in which inbox rows and effects commit,
	// normally a *pgxpool.Pool with at least Concurrency connections.
	// Required.
	DB outbox.Beginner

	// KafkaOpts configure the franz-go clients: seed brokers, TLS, SASL,
	// session timeout and the like. The worker adds its consumer-group
	// settings after them (group = consumer name, cooperative-sticky
	// balancing, no auto-commit, read-committed isolation), so those cannot
	// be overridden. FetchMaxWait defaults to 500ms (Kafka's default, not
	// franz-go's 5s) so that a partition resumed after backpressure is
	// fetched promptly. During a live migration (package migration) the
	// clients of the new channel take these options too, all but those
	// that choose the cluster and its credentials (kgo.SeedBrokers,
	// kgo.DialTLSConfig and kgo.DialTLS, kgo.Dialer, kgo.SASL), which come
	// from the plan's new channel instead. Required unless RabbitMQ is
	// set; with RabbitMQ they carry only the settings of the clients of a
	// live migration's Kafka new channel (session timeout, client id,
	// fetch settings), never those that choose a cluster.
	KafkaOpts []kgo.Opt

	// RabbitMQ makes the worker consume RabbitMQ's shard queues instead of
	// Kafka (see RabbitMQConfig). Defaults to nil: Kafka.
	RabbitMQ *RabbitMQConfig

	// Consumers, when set, limits Run to these registered consumers, so
	// that one binary can be deployed once per consumer. Defaults to every
	// registered consumer.
	Consumers []string

	// Concurrency bounds the transactions in flight at once, across all
	// partitions and consumers of the worker. Defaults to
	// ConcurrencyDefault (8).
	Concurrency int

	// KeyConcurrency, above 1, processes up to this many keys of one
	// partition at once. Messages with the same key keep their order; the
	// partition's offset is committed only up to its lowest unfinished
	// message. Defaults to KeyConcurrencyDefault (1): one message at a time
	// per partition, in offset order.
	KeyConcurrency int

	// BatchSize, above 1, applies up to this many consecutive messages of a
	// partition in one transaction, with a savepoint per message, so that a
	// failing message neither undoes nor blocks the others: it is rolled
	// back to its savepoint and retried after the batch commits, together
	// with the later messages of its key. A batch never waits to fill: it
	// holds what was fetched and not applied yet, so a quiet partition
	// still commits one message per transaction, and one that falls behind
	// (a stall, a burst) catches up at one commit per batch instead of one
	// per message. 1 applies every message in a transaction of its own.
	// Defaults to BatchSizeDefault (16).
	BatchSize int

	// MaxAttempts is how many times a handler may fail on a message before
	// the message is dead-lettered with reason "retries_exhausted". Failures
	// caused by the database are retried without limit and do not count: an
	// unreachable database, and a transaction the server aborted for a
	// deadlock (40P01) or a serialization failure (40001), whether the
	// handler's statement or the commit met it. Defaults to
	// MaxAttemptsDefault (10).
	MaxAttempts int

	// RetryBackoff is the wait after the first failure; each further failure
	// doubles it, up to RetryBackoffMax, with random jitter of up to half the
	// wait. A wait ends at once when the partition is revoked or the worker
	// shuts down. Defaults to RetryBackoffDefault (200ms).
	RetryBackoff time.Duration

	// RetryBackoffMax caps the wait between attempts. Defaults to
	// RetryBackoffMaxDefault (30s).
	RetryBackoffMax time.Duration

	// HandlerTimeout bounds one handler call; a handler that overruns it has
	// failed an attempt. Defaults to HandlerTimeoutDefault (1m).
	HandlerTimeout time.Duration

	// DrainTimeout bounds how long a revoke, a lost partition or shutdown
	// waits for transactions in flight to finish before cancelling them
	// (a cancelled transaction rolls back and its message comes again).
	// Keep it well below the group's rebalance timeout (franz-go's default
	// is 60s). Defaults to DrainTimeoutDefault (15s).
	DrainTimeout time.Duration

	// CommitInterval is how often applied offsets are committed to Kafka.
	// Offsets are also committed when partitions are revoked and at
	// shutdown. A crash repeats at most this much work, which the inbox
	// turns into no-ops. Defaults to CommitIntervalDefault (1s).
	CommitInterval time.Duration

	// HealthTimeout is how long a transaction may run, and the offset
	// commits may go without running, before Healthy reports the worker
	// wedged: a handler that ignores its context, a database call that
	// never returns, a commit loop stuck behind one. An idle worker is
	// healthy. It must exceed HandlerTimeout + 10s and CommitInterval +
	// 20s (two offset commits of at most 10s each). Defaults to
	// HealthTimeoutDefault (2m), or more when those need it.
	HealthTimeout time.Duration

	// MigrationReportInterval is how often, during a live broker migration,
	// the worker publishes each consumer's shadow report to
	// migration.ReportTopic on its channel, for the controller's shadow
	// gate. Defaults to MigrationReportIntervalDefault (10s).
	MigrationReportInterval time.Duration

	// MigrationAllowedLateness is how long after an authoritative copy its
	// shadow may arrive before the report counts it missing. Defaults to
	// MigrationAllowedLatenessDefault (30s).
	MigrationAllowedLateness time.Duration

	// MigrationReportWindow is how far back a migration report looks: the
	// shadow gate judges the copies received in this window before the
	// report (their lateness, missing shadows, mismatches), so it closes
	// while a stall's late copies are in it and passes again once they
	// left it, nothing else being late. Longer is a stricter gate (one
	// outage keeps CUTOVER refused for longer), shorter a more forgiving
	// one. It must exceed MigrationAllowedLateness, or no copy would be
	// old enough in it to show a missing shadow. Defaults to
	// MigrationReportWindowDefault (2m).
	MigrationReportWindow time.Duration

	// MigrationQuarantineAfter bounds how far apart in time an event's two
	// copies reach their clusters during a live migration. An event whose
	// shadow copy arrived and which was never applied goes to the migration
	// quarantine (MigrationQuarantined) once its group consumed the
	// partition its authoritative copy was written to past where that copy
	// would be: past a fence of a later step there, or to the end the
	// partition had at least this long after the shadow came. A group that
	// lags there keeps the event out of the quarantine, however long: its
	// copy is still to come. Defaults to MigrationQuarantineAfterDefault
	// (5m).
	MigrationQuarantineAfter time.Duration

	// MaxBufferedBytesPerPartition is how much fetched data (keys, values,
	// headers and about 128 bytes of bookkeeping per record) a partition
	// may hold before its fetching pauses; it resumes below half. Keep it
	// a few times the fetch size per partition (franz-go's
	// FetchMaxPartitionBytes, 1 MiB by default) so that a partition keeping
	// up never pauses: a pause drops what the client fetched beyond it, to
	// be fetched again. Memory at worst: assigned partitions x (this + one
	// fetch). Defaults to MaxBufferedBytesPerPartitionDefault (4 MiB).
	MaxBufferedBytesPerPartition int

	// OffsetReset says where to start in a partition with no committed
	// offset. Defaults to OffsetResetDefault ("earliest").
	OffsetReset OffsetReset

	// DeadLetterTopic names the dead-letter topic of a topic. Defaults to
	// appending DeadLetterSuffixDefault (".dlq").
	DeadLetterTopic func(topic string) string

	// IDFromPayloadHash, when true, gives a record without an id header the
	// id "sha256:" + the hex SHA-256 of its key and value, instead of
	// dead-lettering it. Two different records with the same key and value
	// are then one message. A RabbitMQ message without an id header or a
	// message id gets the SHA-256 of its exchange, routing key and body
	// (the id the migration bridge gives its copy). Defaults to false.
	IDFromPayloadHash bool

	// Prune, when set, makes Run delete expired inbox rows every
	// Prune.Interval; DB must then also run statements (outbox.DBTX), as a
	// *pgxpool.Pool does. Defaults to nil: Run does not prune.
	Prune *PruneConfig

	// TracerProvider makes the consumer span in which each message's
	// handler runs (OpenTelemetry messaging conventions: system kafka,
	// destination, partition, offset, consumer group, message id), a child
	// of the trace context the message's headers carry; retries and the
	// dead-letter decision are its events. Events a handler writes with
	// outbox.Write and the handler's context continue the same trace.
	// Defaults to nil: OpenTelemetry's global provider, a no-op until the
	// application sets one.
	TracerProvider trace.TracerProvider

	// Propagator reads the trace context from each message's headers.
	// Defaults to nil: OpenTelemetry's global propagator.
	Propagator propagation.TextMapPropagator

	// Logger receives the worker's logs. Defaults to a logger that discards.
	Logger *slog.Logger

	// Registerer receives the worker's metrics. Defaults to nil: no metrics
	// are registered.
	Registerer prometheus.Registerer

	// unsafeCommitBeforeDB breaks "commit the offset after the database"
	// (internal/commitpoint) on purpose: only the fault suite's negative
	// control sets it (UnsafeCommitOffsetsBeforeDB, ferryfault builds).
	unsafeCommitBeforeDB bool
	// unsafeNoMigrationQuarantine leaves a migration's unapplied events
	// out of the quarantine: only the fault suite's negative control sets
	// it (UnsafeNoMigrationQuarantine, ferryfault builds).
	unsafeNoMigrationQuarantine bool
	// unsafeRequeueRetries retries a failed RabbitMQ delivery by
	// Nack(requeue=true) instead of holding it: only the fault suite's
	// negative control sets it (UnsafeRequeueRetries, ferryfault builds).
	unsafeRequeueRetries bool

	// hooks let tests stop the process at exact points.
	hooks hooks
}

// hooks are fault-injection points for tests; nil ones are skipped.
type hooks struct {
	beforeDBCommit func(*Message)
	afterDBCommit  func(*Message)
	rabbitAck      func(tag uint64) // before a RabbitMQ ack of tags up to tag is sent
	stopped        func()           // partitions being released were told to stop
	periodicCommit func()           // the commit loop's tick, before it commits
	reportClock    func() time.Time // the migration reports' clock (migration_report.go)
	quarantined    func()           // a pass of the migration quarantine ended (migration_quarantine.go)
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.Concurrency = cmp.Or(c.Concurrency, ConcurrencyDefault)
	c.KeyConcurrency = cmp.Or(c.KeyConcurrency, KeyConcurrencyDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, RetryBackoffDefault)
	c.RetryBackoffMax = cmp.Or(c.RetryBackoffMax, RetryBackoffMaxDefault)
	c.HandlerTimeout = cmp.Or(c.HandlerTimeout, HandlerTimeoutDefault)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DrainTimeoutDefault)
	c.CommitInterval = cmp.Or(c.CommitInterval, CommitIntervalDefault)
	c.HealthTimeout = cmp.Or(c.HealthTimeout, max(HealthTimeoutDefault, c.minHealthTimeout()+30*time.Second))
	c.MigrationReportInterval = cmp.Or(c.MigrationReportInterval, MigrationReportIntervalDefault)
	c.MigrationAllowedLateness = cmp.Or(c.MigrationAllowedLateness, MigrationAllowedLatenessDefault)
	c.MigrationReportWindow = cmp.Or(c.MigrationReportWindow, MigrationReportWindowDefault)
	c.MigrationQuarantineAfter = cmp.Or(c.MigrationQuarantineAfter, MigrationQuarantineAfterDefault)
	c.MaxBufferedBytesPerPartition = cmp.Or(c.MaxBufferedBytesPerPartition, MaxBufferedBytesPerPartitionDefault)
	c.OffsetReset = cmp.Or(c.OffsetReset, OffsetResetDefault)
	if c.DeadLetterTopic == nil {
		c.DeadLetterTopic = func(topic string) string { return topic + DeadLetterSuffixDefault }
	}
	if c.Prune != nil {
		p := c.Prune.WithDefaults()
		c.Prune = &p
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RabbitMQ != nil {
		r := c.RabbitMQ.withDefaults()
		c.RabbitMQ = &r
	}
	return c
}

func (c Config) validate() error {
	if c.DB == nil {
		return errors.New("inbox: Config.DB is required")
	}
	switch {
	case c.RabbitMQ != nil && slices.ContainsFunc(c.KafkaOpts, reachesCluster):
		return errors.New("inbox: Config.KafkaOpts choose a Kafka cluster and Config.RabbitMQ is set: a worker consumes one of them " +
			"(with RabbitMQ, KafkaOpts carry only the client settings of a live migration's Kafka new channel, never kgo.SeedBrokers, " +
			"kgo.DialTLSConfig, kgo.Dialer or kgo.SASL: the plan's channel gives those)")
	case c.RabbitMQ != nil:
		if err := c.RabbitMQ.validate(); err != nil {
			return err
		}
	case len(c.KafkaOpts) == 0:
		return errors.New("inbox: Config.KafkaOpts is required (at least kgo.SeedBrokers), or Config.RabbitMQ")
	}
	for _, f := range []struct {
		name string
		v    int
	}{
		{"Concurrency", c.Concurrency}, {"KeyConcurrency", c.KeyConcurrency}, {"BatchSize", c.BatchSize},
		{"MaxAttempts", c.MaxAttempts}, {"MaxBufferedBytesPerPartition", c.MaxBufferedBytesPerPartition},
	} {
		if f.v < 1 {
			return fmt.Errorf("inbox: Config.%s is %d: must be at least 1", f.name, f.v)
		}
	}
	// Each transaction in flight holds a PostgreSQL connection and a slot
	// allocated at start; each key lane is a goroutine in every partition.
	// Beyond these bounds a typo allocates gigabytes, or overflows.
	for _, f := range []struct {
		name      string
		v, most   int
		allocates string
	}{
		{"Concurrency", c.Concurrency, 10_000, "a PostgreSQL connection for each transaction in flight"},
		{"KeyConcurrency", c.KeyConcurrency, 1_000, "a goroutine for each key lane of every partition"},
	} {
		if f.v > f.most {
			return fmt.Errorf("inbox: Config.%s is %d: must be at most %d, since the worker opens %s", f.name, f.v, f.most, f.allocates)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"RetryBackoff", c.RetryBackoff}, {"RetryBackoffMax", c.RetryBackoffMax}, {"HandlerTimeout", c.HandlerTimeout},
		{"DrainTimeout", c.DrainTimeout}, {"CommitInterval", c.CommitInterval}, {"HealthTimeout", c.HealthTimeout},
		{"MigrationReportInterval", c.MigrationReportInterval}, {"MigrationAllowedLateness", c.MigrationAllowedLateness},
		{"MigrationReportWindow", c.MigrationReportWindow}, {"MigrationQuarantineAfter", c.MigrationQuarantineAfter},
	} {
		if f.v <= 0 {
			return fmt.Errorf("inbox: Config.%s is %s: must be positive", f.name, f.v)
		}
	}
	if c.HealthTimeout <= c.minHealthTimeout() {
		return fmt.Errorf("inbox: Config.HealthTimeout is %s: must exceed %s, HandlerTimeout + %s and CommitInterval + 2 x %s, "+
			"which a healthy worker may spend in one transaction or between offset commits",
			c.HealthTimeout, c.minHealthTimeout(), commitTimeout, commitTimeout)
	}
	if c.MigrationReportWindow <= c.MigrationAllowedLateness {
		return fmt.Errorf("inbox: Config.MigrationReportWindow (%s) must exceed Config.MigrationAllowedLateness (%s): "+
			"no copy in the window would be old enough to show a missing shadow", c.MigrationReportWindow, c.MigrationAllowedLateness)
	}
	if c.RetryBackoffMax < c.RetryBackoff {
		return fmt.Errorf("inbox: Config.RetryBackoffMax (%s) is below Config.RetryBackoff (%s)", c.RetryBackoffMax, c.RetryBackoff)
	}
	switch c.OffsetReset {
	case OffsetResetEarliest, OffsetResetLatest, OffsetResetNone:
	default:
		return fmt.Errorf("inbox: Config.OffsetReset %q: want earliest, latest or none", c.OffsetReset)
	}
	if c.Prune != nil {
		if _, ok := c.DB.(outbox.DBTX); !ok {
			return fmt.Errorf("inbox: Config.Prune needs a Config.DB that also runs statements (Exec, Query, QueryRow: outbox.DBTX), "+
				"such as a *pgxpool.Pool; %T only begins transactions", c.DB)
		}
		if err := c.Prune.validate(); err != nil {
			return err
		}
	}
	return nil
}

// minHealthTimeout is the longest a healthy worker may spend in one
// transaction (a handler call, then Ferry's commit) or between two runs of
// the commit loop (its interval, its own commit, and a revoke's commit it
// waits behind).
func (c Config) minHealthTimeout() time.Duration {
	return max(c.HandlerTimeout+commitTimeout, c.CommitInterval+2*commitTimeout)
}

// offsets returns the franz-go start and reset offsets of the policy.
func (r OffsetReset) offsets() (start, reset kgo.Offset) {
	switch r {
	case OffsetResetNone:
		// A committed offset that is out of range is fatal for the
		// partition too: nothing moves without an operator.
		return kgo.NewOffset().AtCommitted(), kgo.NoResetOffset()
	case OffsetResetLatest:
		// Latest applies to a partition without a commit only. A committed
		// offset that fell below the log start resumes at the start:
		// re-reading is safe, skipping is not.
		return kgo.NewOffset().AtEnd(), kgo.NewOffset().AtStart()
	default:
		return kgo.NewOffset().AtStart(), kgo.NewOffset().AtStart()
	}
}
