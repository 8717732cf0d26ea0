package relaycli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/relay"
)

// HTTPAddrDefault is where `relay run` serves /metrics, /healthz and
// /readyz unless told otherwise.
const HTTPAddrDefault = ":9187"

// configFlags name the flag of each relay.Config and relay.PruneConfig
// field, for the errors of their validation (see cli.ConfigError).
var configFlags = map[string]string{
	"Config.DatabaseURL":              "database-url",
	"Config.Slot":                     "slot",
	"Config.Publication":              "publication",
	"Config.TopicTemplate":            "topic-template",
	"Config.KafkaOpts":                "kafka-brokers",
	"Config.RabbitMQ.URL":             "rabbitmq-url",
	"Config.RabbitMQ.Vhost":           "rabbitmq-vhost",
	"Config.RabbitMQ.TLSCAFile":       "rabbitmq-tls-ca-file",
	"Config.RabbitMQ.TLSCertFile":     "rabbitmq-tls-cert-file",
	"Config.RabbitMQ.Shards":          "rabbitmq-shards",
	"Config.RabbitMQ.Channels":        "rabbitmq-channels",
	"Config.RabbitMQ.MaxMessageBytes": "rabbitmq-max-message-bytes",
	"Config.RabbitMQ.Consumers":       "rabbitmq-require-consumers",
	"Config.MaxInFlightRecords":       "max-in-flight",
	"Config.StatusInterval":           "status-interval",
	"Config.KafkaLinger":              "kafka-linger",
	"Config.ReadWindow":               "read-window",
	"Config.ServerTimeout":            "server-timeout",
	"Config.UnknownTopicWait":         "unknown-topic-wait",
	"Config.HealthTimeout":            "health-timeout",
	"Config.ShutdownTimeout":          "shutdown-timeout",
	"Config.QuarantineOrder":          "quarantine-order",
	"Config.CloudEvents.Source":       "cloudevents-source",
	"Config.CloudEvents.ContentType":  "cloudevents-content-type",
	"PruneConfig.Retention":           "outbox-retention",
	"PruneConfig.BatchSize":           "prune-batch-size",
	"PruneConfig.Interval":            "prune-interval",
	"PruneConfig.ConfirmWait":         "prune-confirm-wait",
}

// engine are the settings of a relay that publishes: `relay run` and
// `relay recover`.
type engine struct {
	common
	kafka       cli.Kafka
	publication *string
	noCreate    *bool
	topic       *string
	maxInFlight *int
	status      *time.Duration
	linger      *time.Duration
	window      *time.Duration
	server      *time.Duration
	unknown     *time.Duration
	health      *time.Duration
	shutdown    *time.Duration
	ceSource    *string
	ceType      *string
	traceEvents *bool
	stopTracing func() // set by parse; see close
	// rabbit is set on `relay run` and `relay recover`: RabbitMQ instead
	// of Kafka.
	rabbit *rabbitFlags
}

// rabbitFlags are the relay's RabbitMQ settings: the shared --rabbitmq-*
// ones and the publisher's own.
type rabbitFlags struct {
	cli.RabbitMQ
	maxMessageBytes *int
	channels        *int
	consumers       *string
}

func (r *rabbitFlags) register(f *cli.Flags) {
	r.RabbitMQ.Register(f, "ferry-relay")
	r.maxMessageBytes = f.Count("rabbitmq-max-message-bytes", relay.RabbitMQMaxMessageBytesDefault,
		"largest message (body and headers) sent to RabbitMQ; a larger one is quarantined as message_too_large without being sent. Set it to the broker's max_message_size")
	r.channels = f.Count("rabbitmq-channels", relay.RabbitMQChannelsDefault,
		"RabbitMQ publishing channels with confirms: shard s goes on channel s mod this, so each shard stays in order")
	r.consumers = f.String("rabbitmq-require-consumers", "",
		"comma-separated consumers whose shard queues must exist before the relay publishes to an exchange: one that lacks a queue of theirs is held (never quarantined) and /readyz names it, instead of letting events pass by the consumer unseen; empty: rely on returns alone")
}

// config is the relay's RabbitMQ configuration.
func (r *rabbitFlags) config() *relay.RabbitMQConfig {
	return &relay.RabbitMQConfig{
		URL: r.URL, Password: r.Password, Vhost: r.Vhost,
		TLSCAFile: r.TLSCAFile, TLSCertFile: r.TLSCertFile, TLSKeyFile: r.TLSKeyFile, TLSSkipVerify: r.TLSSkipVerify,
		Shards: r.NShards(), Channels: *r.channels, MaxMessageBytes: *r.maxMessageBytes,
		Consumers: splitList(*r.consumers),
	}
}

// close flushes the spans the engine's run buffered (cli.StartTracing).
func (e *engine) close() {
	if e.stopTracing != nil {
		e.stopTracing()
	}
}

func (e *engine) register(f *cli.Flags) {
	e.common.register(f)
	e.kafka.Register(f, "ferry-relay")
	e.publication = f.String("publication", relay.PublicationDefault, "publication on the outbox table")
	e.noCreate = f.Bool("no-create", false, "fail instead of creating a missing slot or publication")
	e.topic = f.String("topic-template", relay.TopicTemplateDefault, "topic of each event; {aggregate_type} and {event_type} are replaced")
	e.maxInFlight = f.Count("max-in-flight", relay.MaxInFlightRecordsDefault, "records sent and not yet acknowledged, at most")
	e.status = f.PositiveDuration("status-interval", relay.StatusIntervalDefault, "how often to confirm the position to PostgreSQL, at most 10s")
	e.linger = f.Duration("kafka-linger", 0, "how long the Kafka producer waits for more records of a partition before it sends them, at most 1s; 0 sends at once, which the read window and GOMAXPROCS=1 make one request per read (give 1ms or more with GOMAXPROCS above 1)")
	e.window = f.Duration("read-window", relay.ReadWindowDefault, "after a read of the replication stream that took all it held, let it gather this long before the next (at low rates several transactions per wake-up, at up to this much latency each; a backlog is read at once), at most 100ms; 0 reads at once")
	e.server = f.PositiveDuration("server-timeout", relay.ServerTimeoutDefault, "silence tolerated on the replication connection, both ways: set as its wal_sender_timeout (a frozen relay's slot is freed for a standby) and the relay reconnects when the server says nothing for this long")
	e.unknown = f.PositiveDuration("unknown-topic-wait", relay.UnknownTopicWaitDefault, "how long the records of a topic that does not exist are held (other topics flow) before they are quarantined as unknown_topic")
	e.health = f.PositiveDuration("health-timeout", relay.HealthTimeoutDefault, "/healthz fails when the relay's loops made no progress for this long")
	e.shutdown = f.PositiveDuration("shutdown-timeout", relay.ShutdownTimeoutDefault, "how long SIGTERM waits for Kafka's acknowledgements")
	e.ceSource = f.String("cloudevents-source", "", "make every record also a CloudEvent (Kafka binding, binary mode: ce_id, ce_type, ce_source, ...) with this ce_source, a URI reference such as /orders; empty: off")
	e.traceEvents = f.Bool("trace-events", false, "a producer span per event (OpenTelemetry; exported when the OTEL_* variables say where), child of the writer's span, whose context the record then carries")
	e.ceType = f.String("cloudevents-content-type", "", "with --cloudevents-source: the content-type of records whose row has none, e.g. application/json")
}

// parse parses args, checks that Kafka takes the connection's security
// settings (see cli.Kafka.Check), and returns the logger and the relay's
// Config.
func (e *engine) parse(ctx context.Context, f *cli.Flags, args []string, stderr io.Writer) (*slog.Logger, *relay.Config, error) {
	logger, err := e.Parse(f, args, stderr)
	if err != nil {
		return nil, nil, err
	}
	if *e.ceType != "" && *e.ceSource == "" {
		return nil, nil, cli.Usagef("--cloudevents-content-type needs --cloudevents-source")
	}
	var kopts []kgo.Opt
	var rabbit *relay.RabbitMQConfig
	switch {
	case e.rabbit != nil && e.rabbit.Enabled() && e.kafka.Brokers != "":
		return nil, nil, cli.Usagef("--kafka-brokers and --rabbitmq-url exclude each other: the relay publishes to one channel")
	case e.rabbit != nil && e.rabbit.Enabled():
		// A wrong password or an untrusted certificate exits here, with
		// what to fix; a broker that does not answer is only a warning.
		if err := e.rabbit.Check(ctx, logger); err != nil {
			return nil, nil, err
		}
		rabbit = e.rabbit.config()
	case e.rabbit != nil && e.kafka.Brokers == "":
		return nil, nil, cli.Usagef("--kafka-brokers (FERRY_KAFKA_BROKERS) is required, unless --rabbitmq-url (FERRY_RABBITMQ_URL) is set")
	default:
		if kopts, err = e.kafka.Opts(logger); err != nil {
			return nil, nil, err
		}
		if err := e.kafka.Check(ctx, logger); err != nil {
			return nil, nil, err
		}
	}
	if e.stopTracing, err = cli.StartTracing(ctx, "ferry-relay", logger); err != nil {
		return nil, nil, err
	}
	return logger, &relay.Config{
		DatabaseURL:        e.DB.URL,
		Slot:               e.slot,
		Publication:        *e.publication,
		NoCreate:           *e.noCreate,
		TopicTemplate:      *e.topic,
		MaxInFlightRecords: *e.maxInFlight,
		StatusInterval:     *e.status,
		KafkaLinger:        *e.linger,
		ReadWindow:         readWindow(*e.window),
		ServerTimeout:      *e.server,
		UnknownTopicWait:   *e.unknown,
		HealthTimeout:      *e.health,
		ShutdownTimeout:    *e.shutdown,
		KafkaOpts:          kopts,
		RabbitMQ:           rabbit,
		CloudEvents:        e.cloudEvents(),
		TraceEvents:        *e.traceEvents,
		Logger:             logger,
	}, nil
}

// readWindow is the --read-window setting as Config.ReadWindow: 0 turns the
// window off.
func readWindow(d time.Duration) time.Duration {
	if d == 0 {
		return relay.ReadWindowOff
	}
	return d
}

// cloudEvents is the CloudEvents mapping the flags ask for; nil when off.
func (e *engine) cloudEvents() *relay.CloudEvents {
	if *e.ceSource == "" {
		return nil
	}
	return &relay.CloudEvents{Source: *e.ceSource, ContentType: *e.ceType}
}

// negativeControls registers the fault suite's negative-control flags on
// `relay run` and returns what applies them to the parsed configuration. It
// is nil except in binaries built with the ferryfault tag
// (run_ferryfault.go): a release relay has no flag that loses data.
var negativeControls func(*flag.FlagSet) func(*relay.Config, *slog.Logger)

func runRelay(ctx context.Context, args []string, _, stderr io.Writer) error {
	f := cli.NewFlags("relay run", stderr)
	var e engine
	e.register(f)
	e.rabbit = &rabbitFlags{}
	e.rabbit.register(f)
	var http cli.HTTP
	http.Register(f, HTTPAddrDefault)
	var p pruneFlags
	p.register(f, true)
	order := f.String("quarantine-order", string(relay.QuarantineOrderDefault),
		"skip: publish an aggregate's later events while one is quarantined (a requeue publishes it after them); "+
			"keep: quarantine them behind it until it is requeued or discarded, sending each aggregate's events one at a time")
	var control func(*relay.Config, *slog.Logger)
	if negativeControls != nil {
		control = negativeControls(f.FlagSet)
	}
	logger, cfg, err := e.parse(ctx, f, args, stderr)
	if err != nil {
		return err
	}
	defer e.close()
	reg := cli.NewRegistry()
	cfg.Registerer = reg
	cfg.Prune = p.config()
	cfg.QuarantineOrder = relay.QuarantineOrder(*order)
	if control != nil {
		control(cfg, logger)
	}
	r, err := relay.New(cfg)
	if err != nil {
		return cli.ConfigError(err, configFlags)
	}
	stopHTTP, err := http.Serve(reg, cli.Probes{Healthy: r.Healthy, Ready: r.Ready, Active: r.Active, Hide: e.DB.Names()}, logger)
	if err != nil {
		return err
	}
	defer stopHTTP()

	channel := slog.String("kafka", e.kafka.String())
	if cfg.RabbitMQ != nil {
		channel = slog.String("rabbitmq", e.rabbit.String())
	}
	logger.Info("relay starting",
		slog.String("database", e.DB.Redacted()), channel,
		slog.String("slot", cfg.Slot), slog.String("publication", cfg.Publication), slog.String("topic_template", cfg.TopicTemplate),
		slog.String("quarantine_order", string(cfg.QuarantineOrder)), slog.Int("gomaxprocs", runtime.GOMAXPROCS(0)))
	if err := r.Run(ctx); err != nil {
		return err
	}
	st := r.Stats()
	logger.Info("relay stopped", slog.Int64("published", st.Published), slog.Int64("quarantined", st.Quarantined))
	return nil
}

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("relay status", stderr)
	var c common
	c.register(f)
	if err := c.parse(f, args, stderr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pool, err := c.DB.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := relay.Status(ctx, pool, c.slot)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "slot\t%s\n", st.Slot)
	switch {
	case !st.Exists && st.Recorded:
		fmt.Fprintf(w, "exists\tno: GONE. Ferry published from it; relay run refuses to start, relay recover replaces it\n")
	case !st.Exists:
		fmt.Fprintf(w, "exists\tno (relay run creates it)\n")
	default:
		active := "no"
		if st.Active {
			active = fmt.Sprintf("yes (pid %d)", st.ActivePID)
		}
		fmt.Fprintf(w, "plugin\t%s\n", st.Plugin)
		fmt.Fprintf(w, "active\t%s\n", active)
		fmt.Fprintf(w, "confirmed_flush_lsn\t%s\n", st.ConfirmedFlushLSN)
		fmt.Fprintf(w, "restart_lsn\t%s\n", st.RestartLSN)
		fmt.Fprintf(w, "retained_wal_bytes\t%d\n", st.RetainedWALBytes)
		fmt.Fprintf(w, "wal_status\t%s\n", st.WALStatus)
		if st.Failover != "" {
			fmt.Fprintf(w, "failover\t%s\n", st.Failover)
			fmt.Fprintf(w, "synced\t%t\n", st.Synced)
		}
	}
	if st.Recorded {
		at := "none yet"
		if !st.RecordedCommitAt.IsZero() {
			at = st.RecordedCommitAt.UTC().Format(time.RFC3339Nano)
		}
		fmt.Fprintf(w, "recorded_lsn\t%s (commit time %s)\n", st.RecordedLSN, at)
	}
	fmt.Fprintf(w, "quarantined\t%d\n", st.Quarantined)
	if err := w.Flush(); err != nil {
		return err
	}
	if st.WALStatus == "lost" {
		return relay.ErrSlotLost
	}
	return nil
}
