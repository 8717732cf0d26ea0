package relaycli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/internal/kafkaconf"
	"github.com/ferryhq/ferry/relay"
)

// common are the settings every subcommand shares.
type common struct {
	databaseURL string
	slot        string
	logFormat   string
	logLevel    string
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.databaseURL, "database-url", cli.Env("FERRY_DATABASE_URL", ""), "PostgreSQL URL (env FERRY_DATABASE_URL)")
	fs.StringVar(&c.slot, "slot", cli.Env("FERRY_SLOT", relay.SlotDefault), "logical replication slot (env FERRY_SLOT)")
	fs.StringVar(&c.logFormat, "log-format", cli.Env("FERRY_LOG_FORMAT", cli.LogFormatAuto), "auto, text or json (env FERRY_LOG_FORMAT)")
	fs.StringVar(&c.logLevel, "log-level", cli.Env("FERRY_LOG_LEVEL", "info"), "debug, info, warn or error (env FERRY_LOG_LEVEL)")
}

func (c *common) logger(w io.Writer) (*slog.Logger, error) {
	if c.databaseURL == "" {
		return nil, errors.New("--database-url (FERRY_DATABASE_URL) is required")
	}
	return cli.NewLogger(w, c.logFormat, c.logLevel)
}

func runRelay(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("relay run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	var kc kafkaconf.Config
	kc.RegisterFlags(fs, "ferry-relay")
	publication := fs.String("publication", cli.Env("FERRY_PUBLICATION", relay.PublicationDefault), "publication on the outbox table (env FERRY_PUBLICATION)")
	noCreate := fs.Bool("no-create", cli.EnvBool("FERRY_NO_CREATE", false), "fail instead of creating a missing slot or publication (env FERRY_NO_CREATE)")
	topic := fs.String("topic-template", cli.Env("FERRY_TOPIC_TEMPLATE", relay.TopicTemplateDefault), "topic of each event; {aggregate_type} and {event_type} are replaced (env FERRY_TOPIC_TEMPLATE)")
	maxInFlight := fs.Int("max-in-flight", cli.EnvInt("FERRY_MAX_IN_FLIGHT", relay.MaxInFlightRecordsDefault), "records sent and not yet acknowledged, at most (env FERRY_MAX_IN_FLIGHT)")
	status := fs.Duration("status-interval", cli.EnvDuration("FERRY_STATUS_INTERVAL", relay.StatusIntervalDefault), "how often to confirm the position to PostgreSQL, at most 10s (env FERRY_STATUS_INTERVAL)")
	shutdown := fs.Duration("shutdown-timeout", cli.EnvDuration("FERRY_SHUTDOWN_TIMEOUT", relay.ShutdownTimeoutDefault), "how long SIGTERM waits for Kafka's acknowledgements (env FERRY_SHUTDOWN_TIMEOUT)")
	autoCreate := fs.Bool("kafka-auto-create-topics", cli.EnvBool("FERRY_KAFKA_AUTO_CREATE_TOPICS", false), "let the broker create missing topics (needs auto.create.topics.enable) (env FERRY_KAFKA_AUTO_CREATE_TOPICS)")
	httpAddr := fs.String("http-addr", cli.Env("FERRY_HTTP_ADDR", ":9187"), "address of /metrics, /healthz and /readyz; off disables (env FERRY_HTTP_ADDR)")
	unsafeConfirm := fs.Bool("unsafe-confirm-on-send", false, "NEGATIVE CONTROL ONLY: confirm WAL before Kafka acknowledges, which loses events on a crash")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger, err := c.logger(stderr)
	if err != nil {
		return err
	}
	kopts, err := kc.Opts()
	if err != nil {
		return err
	}
	kopts = append(kopts, kgo.WithLogger(kslog.New(logger.With(slog.String("component", "kafka")))))
	if *autoCreate {
		kopts = append(kopts, kgo.AllowAutoTopicCreation())
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := &relay.Config{
		DatabaseURL:        c.databaseURL,
		Slot:               c.slot,
		Publication:        *publication,
		NoCreate:           *noCreate,
		TopicTemplate:      *topic,
		MaxInFlightRecords: *maxInFlight,
		StatusInterval:     *status,
		ShutdownTimeout:    *shutdown,
		KafkaOpts:          kopts,
		Logger:             logger,
		Registerer:         reg,
	}
	if *unsafeConfirm {
		relay.UnsafeConfirmOnSend(cfg)
		logger.Warn("NEGATIVE CONTROL: --unsafe-confirm-on-send confirms WAL before Kafka acknowledges; events will be lost on a crash")
	}
	r, err := relay.New(cfg)
	if err != nil {
		return err
	}
	stopHTTP, err := cli.ServeHTTP(*httpAddr, reg, r.Ready, logger)
	if err != nil {
		return err
	}
	defer stopHTTP()

	logger.Info("relay starting",
		slog.String("database", cli.RedactURL(c.databaseURL)), slog.String("kafka", kc.String()),
		slog.String("slot", cfg.Slot), slog.String("publication", cfg.Publication), slog.String("topic_template", cfg.TopicTemplate))
	if err := r.Run(ctx); err != nil {
		return err
	}
	st := r.Stats()
	logger.Info("relay stopped", slog.Int64("published", st.Published), slog.Int64("quarantined", st.Quarantined))
	return nil
}

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("relay status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := c.logger(stderr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, c.databaseURL)
	if err != nil {
		return errors.New("--database-url is not a valid PostgreSQL connection string")
	}
	defer pool.Close()
	st, err := relay.Status(ctx, pool, c.slot)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "slot\t%s\n", st.Slot)
	if !st.Exists {
		fmt.Fprintf(w, "exists\tno (relay run creates it)\n")
	} else {
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
