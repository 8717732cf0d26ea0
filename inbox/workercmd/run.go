package workercmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/internal/kafkaconf"
)

// HTTPAddrDefault is where `worker run` serves /metrics, /healthz and
// /readyz unless told otherwise.
const HTTPAddrDefault = ":9188"

func runWorker(ctx context.Context, args []string, stderr io.Writer, register []Register) error {
	fs := flag.NewFlagSet("worker run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := databaseURLFlag(fs)
	var l logging
	l.register(fs)
	var kc kafkaconf.Config
	kc.RegisterFlags(fs, "ferry-worker")
	consumers := fs.String("consumers", cli.Env("FERRY_CONSUMERS", ""), "comma-separated consumers to run; default all registered (env FERRY_CONSUMERS)")
	concurrency := fs.Int("concurrency", cli.EnvInt("FERRY_CONCURRENCY", inbox.ConcurrencyDefault), "transactions in flight at once, over all partitions (env FERRY_CONCURRENCY)")
	keyConcurrency := fs.Int("key-concurrency", cli.EnvInt("FERRY_KEY_CONCURRENCY", inbox.KeyConcurrencyDefault), "keys of one partition applied at once; 1 keeps offset order (env FERRY_KEY_CONCURRENCY)")
	batchSize := fs.Int("batch-size", cli.EnvInt("FERRY_BATCH_SIZE", inbox.BatchSizeDefault), "messages per transaction, with a savepoint each (env FERRY_BATCH_SIZE)")
	maxAttempts := fs.Int("max-attempts", cli.EnvInt("FERRY_MAX_ATTEMPTS", inbox.MaxAttemptsDefault), "handler calls before a message is dead-lettered (env FERRY_MAX_ATTEMPTS)")
	backoff := fs.Duration("retry-backoff", cli.EnvDuration("FERRY_RETRY_BACKOFF", inbox.RetryBackoffDefault), "wait after the first failure, doubled each time (env FERRY_RETRY_BACKOFF)")
	backoffMax := fs.Duration("retry-backoff-max", cli.EnvDuration("FERRY_RETRY_BACKOFF_MAX", inbox.RetryBackoffMaxDefault), "longest wait between attempts (env FERRY_RETRY_BACKOFF_MAX)")
	handlerTimeout := fs.Duration("handler-timeout", cli.EnvDuration("FERRY_HANDLER_TIMEOUT", inbox.HandlerTimeoutDefault), "longest handler call (env FERRY_HANDLER_TIMEOUT)")
	drainTimeout := fs.Duration("drain-timeout", cli.EnvDuration("FERRY_DRAIN_TIMEOUT", inbox.DrainTimeoutDefault), "how long revokes and SIGTERM wait for transactions in flight (env FERRY_DRAIN_TIMEOUT)")
	commitInterval := fs.Duration("commit-interval", cli.EnvDuration("FERRY_COMMIT_INTERVAL", inbox.CommitIntervalDefault), "how often applied offsets are committed to Kafka (env FERRY_COMMIT_INTERVAL)")
	offsetReset := fs.String("offset-reset", cli.Env("FERRY_OFFSET_RESET", string(inbox.OffsetResetDefault)), "where a partition without a committed offset starts: earliest, latest or none (env FERRY_OFFSET_RESET)")
	dlqSuffix := fs.String("dlq-suffix", cli.Env("FERRY_DLQ_SUFFIX", inbox.DeadLetterSuffixDefault), "dead-letter topic = topic + this suffix (env FERRY_DLQ_SUFFIX)")
	hashIDs := fs.Bool("id-from-payload-hash", cli.EnvBool("FERRY_ID_FROM_PAYLOAD_HASH", false), "give records without an id header the SHA-256 of key and value as id, instead of dead-lettering them (env FERRY_ID_FROM_PAYLOAD_HASH)")
	sessionTimeout := fs.Duration("kafka-session-timeout", cli.EnvDuration("FERRY_KAFKA_SESSION_TIMEOUT", 45*time.Second), "how long the group waits for a member that stopped heartbeating (a crashed worker) before giving its partitions to others; the broker allows 6s to 5m by default (env FERRY_KAFKA_SESSION_TIMEOUT)")
	autoCreate := fs.Bool("kafka-auto-create-topics", cli.EnvBool("FERRY_KAFKA_AUTO_CREATE_TOPICS", false), "let the broker create missing dead-letter topics (needs auto.create.topics.enable) (env FERRY_KAFKA_AUTO_CREATE_TOPICS)")
	httpAddr := fs.String("http-addr", cli.Env("FERRY_HTTP_ADDR", HTTPAddrDefault), "address of /metrics, /healthz and /readyz; off disables (env FERRY_HTTP_ADDR)")
	var p pruneFlags
	p.register(fs)
	pruneInterval := fs.Duration("prune-interval", cli.EnvDuration("FERRY_PRUNE_INTERVAL", inbox.PruneIntervalDefault), "how often to prune expired inbox and outbox rows; 0 disables (env FERRY_PRUNE_INTERVAL)")
	unsafeCommit := fs.Bool("unsafe-commit-before-db", false, "NEGATIVE CONTROL ONLY: commit Kafka offsets before the database transaction, which loses effects on a crash")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := needDatabaseURL(*dbURL); err != nil {
		return err
	}
	logger, err := l.logger()
	if err != nil {
		return err
	}
	kopts, err := kc.Opts()
	if err != nil {
		return usageError{err.Error()}
	}
	kopts = append(kopts, kgo.WithLogger(kslog.New(logger.With(slog.String("component", "kafka")))))
	if *sessionTimeout <= 0 {
		return usageError{"--kafka-session-timeout must be positive"}
	}
	// Heartbeat at least three times per session, as Kafka advises.
	kopts = append(kopts, kgo.SessionTimeout(*sessionTimeout), kgo.HeartbeatInterval(min(3*time.Second, *sessionTimeout/3)))
	if *autoCreate {
		kopts = append(kopts, kgo.AllowAutoTopicCreation())
	}

	poolCfg, err := pgxpool.ParseConfig(*dbURL)
	if err != nil {
		return usageError{"--database-url is not a valid PostgreSQL connection string"}
	}
	if !strings.Contains(*dbURL, "pool_max_conns") {
		// One connection per transaction in flight, and one for pruning.
		poolCfg.MaxConns = int32(max(*concurrency, 1) + 2)
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	suffix := *dlqSuffix
	cfg := &inbox.Config{
		DB:                pool,
		KafkaOpts:         kopts,
		Concurrency:       *concurrency,
		KeyConcurrency:    *keyConcurrency,
		BatchSize:         *batchSize,
		MaxAttempts:       *maxAttempts,
		RetryBackoff:      *backoff,
		RetryBackoffMax:   *backoffMax,
		HandlerTimeout:    *handlerTimeout,
		DrainTimeout:      *drainTimeout,
		CommitInterval:    *commitInterval,
		OffsetReset:       inbox.OffsetReset(*offsetReset),
		DeadLetterTopic:   func(topic string) string { return topic + suffix },
		IDFromPayloadHash: *hashIDs,
		Logger:            logger,
		Registerer:        reg,
	}
	if *consumers != "" {
		for _, c := range strings.Split(*consumers, ",") {
			if c = strings.TrimSpace(c); c != "" {
				cfg.Consumers = append(cfg.Consumers, c)
			}
		}
	}
	if *pruneInterval > 0 {
		pc := p.config()
		pc.Interval = *pruneInterval
		cfg.Prune = &pc
	}
	if *unsafeCommit {
		inbox.UnsafeCommitOffsetsBeforeDB(cfg)
		logger.Warn("NEGATIVE CONTROL: --unsafe-commit-before-db commits offsets before the database; effects will be lost on a crash")
	}
	w, err := inbox.New(cfg)
	if err != nil {
		return usageError{err.Error()}
	}
	for _, r := range register {
		if err := r(w); err != nil {
			return fmt.Errorf("register handlers: %w", err)
		}
	}
	if len(w.Consumers()) == 0 {
		return errors.New("no handlers registered: `worker run` hosts the handlers its main registers " +
			"(workercmd.Main(ctx, args, stdout, stderr, register)); see README, \"Writing a worker\"")
	}

	stopHTTP, err := cli.ServeHTTP(*httpAddr, reg, w.Ready, logger)
	if err != nil {
		return err
	}
	defer stopHTTP()

	logger.Info("worker starting",
		slog.String("database", cli.RedactURL(*dbURL)), slog.String("kafka", kc.String()),
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
