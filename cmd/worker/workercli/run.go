package workercli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/migration"
)

// HTTPAddrDefault is where `run` serves /metrics, /healthz and /readyz
// unless told otherwise.
const HTTPAddrDefault = ":9188"

// SessionTimeoutDefault is --kafka-session-timeout's default, Kafka's own.
const SessionTimeoutDefault = 45 * time.Second

// configFlags name the flag of each inbox.Config and inbox.PruneConfig
// field, for the errors of their validation (see cli.ConfigError).
var configFlags = map[string]string{
	"Config.Concurrency":              "concurrency",
	"Config.KeyConcurrency":           "key-concurrency",
	"Config.BatchSize":                "batch-size",
	"Config.MaxAttempts":              "max-attempts",
	"Config.RetryBackoff":             "retry-backoff",
	"Config.RetryBackoffMax":          "retry-backoff-max",
	"Config.HandlerTimeout":           "handler-timeout",
	"Config.DrainTimeout":             "drain-timeout",
	"Config.CommitInterval":           "commit-interval",
	"Config.HealthTimeout":            "health-timeout",
	"Config.MigrationReportInterval":  "migration-report-interval",
	"Config.MigrationAllowedLateness": "migration-allowed-lateness",
	"Config.MigrationReportWindow":    "migration-report-window",
	"Config.MigrationQuarantineAfter": "migration-quarantine-after",
	"Config.OffsetReset":              "offset-reset",
	"Config.Consumers":                "consumers",
	"PruneConfig.InboxRetention":      "inbox-retention",
	"PruneConfig.InboxRetentionMin":   "inbox-retention-min",
	"PruneConfig.BatchSize":           "prune-batch-size",
	"PruneConfig.Interval":            "prune-interval",
}

// checkDeadLetterSuffix refuses a --dlq-suffix that does not make a
// dead-letter topic of its own: an empty one names the topic itself, so
// every dead letter would be consumed, fail and be dead-lettered again, and
// a character Kafka does not allow in topic names would fail every dead
// letter's produce.
func checkDeadLetterSuffix(s string) error {
	if s == "" {
		return cli.Usagef("--dlq-suffix (FERRY_DLQ_SUFFIX) is empty: the dead-letter topic would be the topic itself; "+
			"use a suffix such as %s", inbox.DeadLetterSuffixDefault)
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return cli.Usagef("--dlq-suffix (FERRY_DLQ_SUFFIX) %q: Kafka topic names take letters, digits, '.', '_' and '-' only", s)
		}
	}
	return nil
}

// negativeControls registers the fault suite's negative-control flags on
// `run` and returns what applies them to the parsed configuration. It is
// nil except in binaries built with the ferryfault tag (run_ferryfault.go):
// a release worker has no flag that loses data.
var negativeControls func(*flag.FlagSet) func(*inbox.Config, *slog.Logger)

func runWorker(ctx context.Context, name string, args []string, stderr io.Writer, register Register) error {
	f := cli.NewFlags(name+" run", stderr)
	var base cli.Base
	base.Register(f)
	var kafka cli.Kafka
	kafka.Register(f, "ferry-worker")
	var rabbit rabbitFlags
	rabbit.register(f)
	var http cli.HTTP
	http.Register(f, HTTPAddrDefault)
	consumers := f.String("consumers", "", "comma-separated consumers to run; default all registered")
	concurrency := f.Count("concurrency", inbox.ConcurrencyDefault, "transactions in flight at once, over all partitions")
	keyConcurrency := f.Count("key-concurrency", inbox.KeyConcurrencyDefault, "keys of one partition applied at once; 1 keeps offset order")
	batchSize := f.Count("batch-size", inbox.BatchSizeDefault, "messages per transaction, with a savepoint each")
	maxAttempts := f.Count("max-attempts", inbox.MaxAttemptsDefault, "handler calls before a message is dead-lettered")
	backoff := f.PositiveDuration("retry-backoff", inbox.RetryBackoffDefault, "wait after the first failure, doubled each time")
	backoffMax := f.PositiveDuration("retry-backoff-max", inbox.RetryBackoffMaxDefault, "longest wait between attempts")
	handlerTimeout := f.PositiveDuration("handler-timeout", inbox.HandlerTimeoutDefault, "longest handler call")
	drainTimeout := f.PositiveDuration("drain-timeout", inbox.DrainTimeoutDefault, "how long revokes and SIGTERM wait for transactions in flight")
	commitInterval := f.PositiveDuration("commit-interval", inbox.CommitIntervalDefault, "how often applied offsets are committed to Kafka")
	healthTimeout := f.Duration("health-timeout", 0, "/healthz fails when a transaction ran this long or offset commits stopped this long; default 2m, or more when --handler-timeout needs it")
	reportInterval := f.PositiveDuration("migration-report-interval", inbox.MigrationReportIntervalDefault,
		"live migration: how often the consumers' shadow reports go to "+migration.ReportTopic)
	allowedLateness := f.PositiveDuration("migration-allowed-lateness", inbox.MigrationAllowedLatenessDefault,
		"live migration: how late a shadow copy may be before the report counts it missing")
	reportWindow := f.PositiveDuration("migration-report-window", inbox.MigrationReportWindowDefault,
		"live migration: how far back a shadow report looks; the gate judges the copies received in this window, "+
			"so a stall's late copies keep CUTOVER refused until they are older (must exceed --migration-allowed-lateness)")
	quarantineAfter := f.PositiveDuration("migration-quarantine-after", inbox.MigrationQuarantineAfterDefault,
		"live migration: how far apart an event's two copies may reach their clusters; an event never applied is quarantined "+
			"once its group consumed its authoritative copy's partition to where it stood this long after the shadow came")
	offsetReset := f.String("offset-reset", string(inbox.OffsetResetDefault), "where a partition without a committed offset starts: earliest, latest or none")
	// FERRY_DLQ_SUFFIX="" is the empty suffix, which is refused below, not unset.
	dlqSuffix := f.StringEmptyIsValue("dlq-suffix", inbox.DeadLetterSuffixDefault, "dead-letter topic = topic + this suffix")
	hashIDs := f.Bool("id-from-payload-hash", false, "give records without an id header the SHA-256 of key and value as id (a RabbitMQ message without an id header or message id: of exchange, routing key and body), instead of dead-lettering them")
	sessionTimeout := f.PositiveDuration("kafka-session-timeout", SessionTimeoutDefault, "how long the group waits for a member that stopped heartbeating (a crashed worker) before giving its partitions to others; the broker allows 6s to 5m by default")
	var p pruneFlags
	p.register(f, true)
	var control func(*inbox.Config, *slog.Logger)
	if negativeControls != nil {
		control = negativeControls(f.FlagSet)
	}
	logger, err := base.Parse(f, args, stderr)
	if err != nil {
		return err
	}
	poolCfg, err := base.DB.PoolConfig()
	if err != nil {
		return err
	}
	var kopts []kgo.Opt
	var rcfg *inbox.RabbitMQConfig
	if rabbit.Enabled() {
		if kafka.Brokers != "" {
			return cli.Usagef("--kafka-brokers and --rabbitmq-url are both set: a worker consumes one of them")
		}
		if rcfg, err = rabbit.config(); err != nil {
			return err
		}
		if err := rabbit.Check(ctx, logger); err != nil {
			return err
		}
		// The clients of a live migration's Kafka new channel (the plan
		// gives their brokers and security).
		kopts = []kgo.Opt{kgo.SessionTimeout(*sessionTimeout), kgo.HeartbeatInterval(min(3*time.Second, *sessionTimeout/3))}
		if kafka.ClientID != "" {
			kopts = append(kopts, kgo.ClientID(kafka.ClientID))
		}
	} else {
		if kafka.Brokers == "" {
			return cli.Usagef("--kafka-brokers (FERRY_KAFKA_BROKERS) is required, or --rabbitmq-url (FERRY_RABBITMQ_URL) to consume RabbitMQ")
		}
		if kopts, err = kafka.Opts(logger); err != nil {
			return err
		}
		if err := kafka.Check(ctx, logger); err != nil {
			return err
		}
		// Heartbeat at least three times per session, as Kafka advises.
		kopts = append(kopts, kgo.SessionTimeout(*sessionTimeout), kgo.HeartbeatInterval(min(3*time.Second, *sessionTimeout/3)))
	}

	if err := checkDeadLetterSuffix(*dlqSuffix); err != nil {
		return err
	}
	if !strings.Contains(base.DB.URL, "pool_max_conns") {
		// One connection per transaction in flight, and one for pruning.
		// inbox.New refuses a --concurrency near MaxInt32; min keeps the
		// sum from wrapping around before it can.
		poolCfg.MaxConns = int32(min(*concurrency, math.MaxInt32-2) + 2)
	}
	pool, err := cli.OpenPool(ctx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	reg := cli.NewRegistry()
	suffix := *dlqSuffix
	cfg := &inbox.Config{
		DB:                       pool,
		KafkaOpts:                kopts,
		RabbitMQ:                 rcfg,
		Consumers:                splitList(*consumers),
		Concurrency:              *concurrency,
		KeyConcurrency:           *keyConcurrency,
		BatchSize:                *batchSize,
		MaxAttempts:              *maxAttempts,
		RetryBackoff:             *backoff,
		RetryBackoffMax:          *backoffMax,
		HandlerTimeout:           *handlerTimeout,
		DrainTimeout:             *drainTimeout,
		CommitInterval:           *commitInterval,
		HealthTimeout:            *healthTimeout,
		MigrationReportInterval:  *reportInterval,
		MigrationAllowedLateness: *allowedLateness,
		MigrationReportWindow:    *reportWindow,
		MigrationQuarantineAfter: *quarantineAfter,
		OffsetReset:              inbox.OffsetReset(*offsetReset),
		DeadLetterTopic:          func(topic string) string { return topic + suffix },
		IDFromPayloadHash:        *hashIDs,
		Prune:                    p.config(),
		Logger:                   logger,
		Registerer:               reg,
	}
	if control != nil {
		control(cfg, logger)
	}
	stopTracing, err := cli.StartTracing(ctx, name, logger)
	if err != nil {
		return err
	}
	defer stopTracing()
	w, err := inbox.New(cfg)
	if err != nil {
		return cli.ConfigError(err, configFlags)
	}
	if err := register(w); err != nil {
		return fmt.Errorf("register handlers: %w", err)
	}
	if len(w.Consumers()) == 0 {
		return errors.New("no handlers registered: App.Register added none; see docs/worker.md")
	}

	stopHTTP, err := http.Serve(reg, cli.Probes{Healthy: w.Healthy, Ready: w.Ready, Hide: base.DB.Names()}, logger)
	if err != nil {
		return err
	}
	defer stopHTTP()

	logger.Info("worker starting",
		slog.String("database", base.DB.Redacted()), slog.String("broker", rabbit.describe(&kafka)),
		slog.Any("consumers", consumersOf(w, cfg.Consumers)))
	return w.Run(ctx)
}

// consumersOf describes the consumers Run will start and their topics.
func consumersOf(w *inbox.Worker, only []string) []string {
	names := only
	if len(names) == 0 {
		names = w.Consumers()
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, n+"<-"+strings.Join(w.Topics(n), "+"))
	}
	return out
}
