package workercli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
)

const dlqUsage = `Usage:
  %[1]s dlq list --topic T [--id ID,...] [--consumer C] [--since T] [--until T]
  %[1]s dlq redrive --topic T (--id ID,... | --since T | --until T | --consumer C | --all)
  %[1]s dlq parked list|redrive ...  (messages Kafka refused as dead letters)

--topic is a dead-letter topic, such as outbox.event.order.dlq. --since and
--until take an RFC 3339 time or a duration ago (24h, 7d) and compare with
the time of failure.

With --rabbitmq-url, --topic is the topic's dead-letter stream (such as
outbox.event.order.dlq), read without consuming it until nothing comes for
--rabbitmq-idle; it holds Ferry's dead letters and the broker's own (reason
delivery_limit). Redrive publishes each to the shard queue it came from.
`

// dlqFlags select dead letters.
type dlqFlags struct {
	kafka    cli.Kafka
	rabbit   cli.RabbitMQ
	idle     *time.Duration
	topic    *string
	ids      *string
	consumer *string
	since    cli.TimeValue
	until    cli.TimeValue
	timeout  *time.Duration
}

// register binds the selection; it has no environment variables, since a
// selection left in the environment would redrive the wrong letters.
func (d *dlqFlags) register(f *cli.Flags) {
	d.kafka.Register(f, "ferry-worker-dlq")
	d.rabbit.Register(f, "ferry-worker-dlq")
	d.idle = f.FlagSet.Duration("rabbitmq-idle", inbox.RabbitMQIdleDefault, "RabbitMQ: the stream is taken as read once nothing came for this long (AMQP tells a reader no end)")
	d.topic = f.FlagSet.String("topic", "", "dead-letter topic (required)")
	d.ids = f.FlagSet.String("id", "", "comma-separated message ids")
	d.consumer = f.FlagSet.String("consumer", "", "only dead letters of this consumer")
	f.FlagSet.Var(&d.since, "since", "failed at or after: RFC 3339 time or duration ago (24h, 7d)")
	f.FlagSet.Var(&d.until, "until", "failed before: RFC 3339 time or duration ago")
	d.timeout = f.FlagSet.Duration("timeout", time.Minute, "give up reading the topic after this long")
}

func (d *dlqFlags) filter() *inbox.DeadLetterFilter {
	return &inbox.DeadLetterFilter{Consumer: *d.consumer, Since: d.since.T, Until: d.until.T, IDs: splitList(*d.ids)}
}

func (d *dlqFlags) empty() bool {
	f := d.filter()
	return len(f.IDs) == 0 && f.Consumer == "" && f.Since.IsZero() && f.Until.IsZero()
}

func runDLQ(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "parked" {
		return runParked(ctx, name, args[1:], stdout, stderr)
	}
	if len(args) > 0 && cli.IsHelp(args[0]) {
		fmt.Fprintf(stdout, dlqUsage, name)
		return nil
	}
	if len(args) == 0 || (args[0] != "list" && args[0] != "redrive") {
		fmt.Fprintf(stderr, dlqUsage, name)
		return cli.Usagef("want dlq list, dlq redrive or dlq parked")
	}
	action := args[0]
	f := cli.NewFlags(name+" dlq "+action, stderr)
	var d dlqFlags
	d.register(f)
	all := new(bool)
	if action == "redrive" {
		f.FlagSet.BoolVar(all, "all", false, "every dead letter of the topic")
	}
	if err := f.Parse(args[1:]); err != nil {
		return err
	}
	if *d.topic == "" {
		return cli.Usagef("--topic is required (a dead-letter topic, such as outbox.event.order.dlq)")
	}
	ctx, cancel := context.WithTimeout(ctx, *d.timeout)
	defer cancel()
	if d.rabbit.Enabled() {
		return runRabbitDLQ(ctx, name, action, &d, *all, stdout)
	}
	kopts, err := d.kafka.Opts(nil)
	if err != nil {
		return err
	}
	if action == "list" {
		dls, err := inbox.ListDeadLetters(ctx, kopts, *d.topic, d.filter())
		if err != nil {
			return err
		}
		printDeadLetters(stdout, dls)
		fmt.Fprintf(stdout, "%d dead letters\n", len(dls))
		return nil
	}
	if d.empty() && !*all {
		return cli.Usagef("redrive needs a selection (--id, --since, --until, --consumer) or --all")
	}
	fmt.Fprintf(stdout, "dead-letter topic %s on %s\n", *d.topic, d.kafka.Brokers)
	res, err := inbox.Redrive(ctx, kopts, *d.topic, d.filter())
	if res != nil {
		for _, dl := range res.Redriven {
			fmt.Fprintf(stdout, "redriven %s from %s/%d/%d to %s/%d\n", cli.Cell(dl.ID, 80), dl.Topic, dl.Partition, dl.Offset, cli.Cell(dl.OriginalTopic, 100), dl.OriginalPartition)
		}
		for i, dl := range res.Skipped {
			fmt.Fprintf(stdout, "skipped %s/%d/%d: %s\n", dl.Topic, dl.Partition, dl.Offset, cli.Cell(res.SkipReasons[i], 300))
		}
		fmt.Fprintf(stdout, "%d redriven, %d skipped\n", len(res.Redriven), len(res.Skipped))
	}
	if errors.Is(err, inbox.ErrNoDeadLetter) {
		return fmt.Errorf("%w (`%s dlq list --topic %s` shows the dead letters)", err, name, *d.topic)
	}
	return err
}

func printDeadLetters(w io.Writer, dls []inbox.DeadLetter) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FAILED AT\tID\tREASON\tATTEMPTS\tCONSUMER\tFROM\tAT\tERROR")
	// Every header is whatever the record's producer wrote: escaped and cut
	// (see cli.Cell). The error is always quoted, as it often spans lines.
	for _, d := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s/%d/%d\t%s/%d/%d\t%s\n",
			d.FailedAt.UTC().Format(time.RFC3339), cli.Cell(orDash(d.ID), 80), cli.Cell(string(d.Reason), 40), d.Attempts, cli.Cell(d.Consumer, 60),
			cli.Cell(d.OriginalTopic, 100), d.OriginalPartition, d.OriginalOffset, cli.Cell(d.Topic, 100), d.Partition, d.Offset,
			cli.Cell(strconv.Quote(d.Error), 120))
	}
	_ = tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
