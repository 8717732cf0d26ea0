package workercmd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/kafkaconf"
)

const dlqUsage = `Usage:
  worker dlq list --topic T [--id ID,...] [--consumer C] [--since T] [--until T]
  worker dlq redrive --topic T (--id ID,... | --since T | --until T | --consumer C | --all)

--topic is a dead-letter topic, such as outbox.event.order.dlq. --since and
--until take an RFC 3339 time or a duration ago (24h, 7d) and compare with
the time of failure.
`

// dlqFlags select dead letters.
type dlqFlags struct {
	kc       kafkaconf.Config
	topic    *string
	ids      *string
	consumer *string
	since    timeValue
	until    timeValue
	timeout  *time.Duration
}

func (d *dlqFlags) register(fs *flag.FlagSet) {
	d.kc.RegisterFlags(fs, "ferry-worker-dlq")
	d.topic = fs.String("topic", "", "dead-letter topic (required)")
	d.ids = fs.String("id", "", "comma-separated message ids")
	d.consumer = fs.String("consumer", "", "only dead letters of this consumer")
	fs.Var(&d.since, "since", "failed at or after: RFC 3339 time or duration ago (24h, 7d)")
	fs.Var(&d.until, "until", "failed before: RFC 3339 time or duration ago")
	d.timeout = fs.Duration("timeout", time.Minute, "give up reading the topic after this long")
}

func (d *dlqFlags) filter() *inbox.DeadLetterFilter {
	f := &inbox.DeadLetterFilter{Consumer: *d.consumer, Since: d.since.t, Until: d.until.t}
	for _, id := range strings.Split(*d.ids, ",") {
		if id = strings.TrimSpace(id); id != "" {
			f.IDs = append(f.IDs, id)
		}
	}
	return f
}

func (d *dlqFlags) empty() bool {
	f := d.filter()
	return len(f.IDs) == 0 && f.Consumer == "" && f.Since.IsZero() && f.Until.IsZero()
}

func runDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "redrive") {
		fmt.Fprint(stderr, dlqUsage)
		return usageError{"want dlq list or dlq redrive"}
	}
	action := args[0]
	fs := flag.NewFlagSet("worker dlq "+action, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var d dlqFlags
	d.register(fs)
	all := fs.Bool("all", false, "redrive: every dead letter of the topic")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *d.topic == "" {
		return usageError{"--topic is required (a dead-letter topic, such as outbox.event.order.dlq)"}
	}
	kopts, err := d.kc.Opts()
	if err != nil {
		return usageError{err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, *d.timeout)
	defer cancel()
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
		return usageError{"redrive needs a selection (--id, --since, --until, --consumer) or --all"}
	}
	res, err := inbox.Redrive(ctx, kopts, *d.topic, d.filter())
	if res != nil {
		for _, dl := range res.Redriven {
			fmt.Fprintf(stdout, "redriven %s from %s/%d/%d to %s/%d\n", dl.ID, dl.Topic, dl.Partition, dl.Offset, dl.OriginalTopic, dl.OriginalPartition)
		}
		for _, dl := range res.Skipped {
			fmt.Fprintf(stdout, "skipped %s/%d/%d: no origin headers\n", dl.Topic, dl.Partition, dl.Offset)
		}
		fmt.Fprintf(stdout, "%d redriven, %d skipped\n", len(res.Redriven), len(res.Skipped))
	}
	return err
}

func printDeadLetters(w io.Writer, dls []inbox.DeadLetter) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FAILED AT\tID\tREASON\tATTEMPTS\tCONSUMER\tFROM\tAT\tERROR")
	for _, d := range dls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s/%d/%d\t%s/%d/%d\t%s\n",
			d.FailedAt.UTC().Format(time.RFC3339), orDash(d.ID), d.Reason, d.Attempts, d.Consumer,
			d.OriginalTopic, d.OriginalPartition, d.OriginalOffset, d.Topic, d.Partition, d.Offset, oneLine(d.Error))
	}
	_ = tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string) string {
	s = strings.ReplaceAll(strings.ReplaceAll(s, "\n", " "), "\t", " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return strconv.Quote(s)
}
