package workercli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// rabbitHelp is what the commands say about a consumer's RabbitMQ queues.
const rabbitHelp = "RabbitMQ: a consumer's shard queues receive only what is published after they exist; " +
	"declare them (schema with --rabbitmq-url, or the first run) before the relay publishes what the consumer must see"

// rabbitFlags are the worker's RabbitMQ settings: the shared --rabbitmq-*
// ones and the consumer's own.
type rabbitFlags struct {
	cli.RabbitMQ
	prefetch      *int
	deliveryLimit *int
	noCreate      *bool
}

func (r *rabbitFlags) register(f *cli.Flags) {
	r.RabbitMQ.Register(f, "ferry-worker")
	r.prefetch = f.Int("rabbitmq-prefetch", inbox.RabbitMQPrefetchDefault,
		"RabbitMQ: unacknowledged deliveries per shard queue, the in-flight bound of a shard (at most 2000)")
	r.deliveryLimit = f.Int("rabbitmq-delivery-limit", rabbitmq.DeliveryLimitDefault,
		"RabbitMQ: the shard queues' x-delivery-limit: deliveries a worker died holding before the broker dead-letters the message to TOPIC.dlq")
	r.noCreate = f.Bool("rabbitmq-no-create", false,
		"RabbitMQ: only verify that the consumers' shard queues exist, and refuse to start naming the missing ones, instead of declaring them. "+rabbitHelp)
}

// config validates the settings and returns them as the engine's.
func (r *rabbitFlags) config() (*inbox.RabbitMQConfig, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if *r.prefetch < 1 || *r.prefetch > inbox.RabbitMQPrefetchMax {
		return nil, cli.Usagef("--rabbitmq-prefetch %d: want 1 to %d", *r.prefetch, inbox.RabbitMQPrefetchMax)
	}
	if *r.deliveryLimit < 1 {
		return nil, cli.Usagef("--rabbitmq-delivery-limit %d: want at least 1", *r.deliveryLimit)
	}
	return &inbox.RabbitMQConfig{
		URL: r.URL, Password: r.Password, Vhost: r.Vhost,
		TLSCAFile: r.TLSCAFile, TLSCertFile: r.TLSCertFile, TLSKeyFile: r.TLSKeyFile, SkipVerify: r.TLSSkipVerify,
		Shards: r.NShards(), Prefetch: *r.prefetch, DeliveryLimit: *r.deliveryLimit, NoCreate: *r.noCreate, Name: r.Name,
	}, nil
}

// describe names the broker for the start-up log, without a secret.
func (r *rabbitFlags) describe(k *cli.Kafka) string {
	if r.Enabled() {
		return "rabbitmq " + r.String()
	}
	return "kafka " + k.String()
}

// declareQueues declares the RabbitMQ shard queues of every consumer the
// application registers (`schema` with --rabbitmq-url), or with
// --rabbitmq-no-create verifies them.
func declareQueues(ctx context.Context, name string, r *rabbitFlags, register Register, stdout io.Writer) error {
	if register == nil {
		return cli.Usagef("--rabbitmq-url: declaring the consumers' queues needs their handlers: run `%s schema` from your own worker's main (workercli.App.Register)", name)
	}
	rcfg, err := r.config()
	if err != nil {
		return err
	}
	// A worker only to learn the consumers and their topics: it never runs.
	w, err := inbox.New(&inbox.Config{DB: noDB{}, RabbitMQ: rcfg})
	if err != nil {
		return cli.ConfigError(err, configFlags)
	}
	if err := register(w); err != nil {
		return fmt.Errorf("register handlers: %w", err)
	}
	for _, c := range w.Consumers() {
		topics := w.Topics(c)
		created, err := inbox.DeclareRabbitMQ(ctx, rcfg, c, topics)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "rabbitmq: consumer %s, topics %s: %d shard queues each, %d created\n", c, strings.Join(topics, ","), rcfg.Shards, len(created))
		if len(created) > 0 {
			fmt.Fprintf(stdout, "rabbitmq: WARNING: the %d queues created now hold nothing published before now: those events will never reach consumer %s\n", len(created), c)
		}
	}
	return nil
}

// rabbitConnection is the engine's configuration of r for the commands
// that only read (dlq, status): the connection and the shards.
func rabbitConnection(r *cli.RabbitMQ) *inbox.RabbitMQConfig {
	return &inbox.RabbitMQConfig{
		URL: r.URL, Password: r.Password, Vhost: r.Vhost,
		TLSCAFile: r.TLSCAFile, TLSCertFile: r.TLSCertFile, TLSKeyFile: r.TLSKeyFile, SkipVerify: r.TLSSkipVerify,
		Shards: r.NShards(), Name: r.Name,
	}
}

// noDB is the database of a worker that never runs.
type noDB struct{}

func (noDB) Begin(context.Context) (pgx.Tx, error) {
	return nil, errors.New("no database: this worker only lists its consumers")
}

// runRabbitDLQ is `dlq list` and `dlq redrive` on a RabbitMQ dead-letter
// stream.
func runRabbitDLQ(ctx context.Context, name, action string, d *dlqFlags, all bool, stdout io.Writer) error {
	if err := d.rabbit.Validate(); err != nil {
		return err
	}
	rcfg := rabbitConnection(&d.rabbit)
	if action == "list" {
		dls, err := inbox.ListRabbitMQDeadLetters(ctx, rcfg, *d.topic, d.filter(), *d.idle)
		if err != nil {
			return err
		}
		printRabbitDeadLetters(stdout, dls)
		fmt.Fprintf(stdout, "%d dead letters\n", len(dls))
		return nil
	}
	if d.empty() && !all {
		return cli.Usagef("redrive needs a selection (--id, --since, --until, --consumer) or --all")
	}
	fmt.Fprintf(stdout, "dead-letter stream %s on %s\n", *d.topic, d.rabbit.String())
	res, err := inbox.RedriveRabbitMQ(ctx, rcfg, *d.topic, d.filter(), *d.idle)
	if res != nil {
		for _, dl := range res.Redriven {
			fmt.Fprintf(stdout, "redriven %s from %s/%d to queue %s\n", cli.Cell(dl.ID, 80), dl.Topic, dl.Offset, cli.Cell(dl.OriginalQueue, 260))
		}
		for i, dl := range res.Skipped {
			fmt.Fprintf(stdout, "skipped %s/%d: %s\n", dl.Topic, dl.Offset, cli.Cell(res.SkipReasons[i], 300))
		}
		fmt.Fprintf(stdout, "%d redriven, %d skipped\n", len(res.Redriven), len(res.Skipped))
	}
	if errors.Is(err, inbox.ErrNoDeadLetter) {
		return fmt.Errorf("%w (`%s dlq list --rabbitmq-url ... --topic %s` shows the dead letters)", err, name, *d.topic)
	}
	return err
}

func printRabbitDeadLetters(w io.Writer, dls []inbox.DeadLetter) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FAILED AT\tID\tREASON\tATTEMPTS\tCONSUMER\tQUEUE\tAT\tERROR")
	for _, d := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s/%d\t%s\n",
			d.FailedAt.UTC().Format(time.RFC3339), cli.Cell(orDash(d.ID), 80), cli.Cell(string(d.Reason), 40), d.Attempts, cli.Cell(orDash(d.Consumer), 60),
			cli.Cell(orDash(d.OriginalQueue), 260), cli.Cell(d.Topic, 100), d.Offset, cli.Cell(strconv.Quote(d.Error), 120))
	}
	_ = tw.Flush()
}
