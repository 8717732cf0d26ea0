package workercli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
)

const parkedUsage = `Usage:
  %[1]s dlq parked list [--consumer C] [--limit N]
  %[1]s dlq parked redrive (--consumer C | --all) [--limit N]

Parked messages could be neither applied nor dead-lettered: Kafka refused
their dead letter for good (too large). They wait in the worker database's
inbox_parked table. Redrive republishes each to its original topic and
partition (fix the handler first) and deletes it from the table.
`

// runParked lists or redrives the messages in inbox_parked.
func runParked(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && cli.IsHelp(args[0]) {
		fmt.Fprintf(stdout, parkedUsage, name)
		return nil
	}
	if len(args) == 0 || (args[0] != "list" && args[0] != "redrive") {
		fmt.Fprintf(stderr, parkedUsage, name)
		return cli.Usagef("want dlq parked list or dlq parked redrive")
	}
	action := args[0]
	f := cli.NewFlags(name+" dlq parked "+action, stderr)
	var base cli.Base
	base.Register(f)
	var kafka cli.Kafka
	// No environment variables for the selection, as for dead letters.
	consumer := f.FlagSet.String("consumer", "", "only the messages of this consumer")
	limit := f.FlagSet.Int("limit", 100, "at most this many messages")
	all := new(bool)
	if action == "redrive" {
		kafka.Register(f, "ferry-worker-parked")
		f.FlagSet.BoolVar(all, "all", false, "every parked message")
	}
	timeout := f.FlagSet.Duration("timeout", time.Minute, "give up after this long")
	if _, err := base.Parse(f, args[1:], stderr); err != nil {
		return err
	}
	if *limit < 1 {
		return cli.Usagef("--limit must be at least 1, got %d", *limit)
	}
	if action == "redrive" && *consumer == "" && !*all {
		return cli.Usagef("redrive needs --consumer C or --all")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	pool, err := base.DB.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	parked, err := inbox.ListParked(ctx, pool, *consumer, *limit)
	if err != nil {
		return err
	}
	if action == "list" {
		printParked(stdout, parked)
		fmt.Fprintf(stdout, "%d parked messages\n", len(parked))
		return nil
	}
	if len(parked) == 0 && *consumer != "" {
		// A consumer named and not found is a mistake (a typo, the wrong
		// database), as an unknown id is for `relay quarantine requeue`.
		return fmt.Errorf("no parked message of consumer %q in inbox_parked (`%s dlq parked list` shows them)", *consumer, name)
	}
	kopts, err := kafka.Opts(nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "parked messages in %s, to %s\n", base.DB.Redacted(), kafka.Brokers)
	n := 0
	for _, p := range parked {
		if err := inbox.RedriveParked(ctx, pool, kopts, p); err != nil {
			fmt.Fprintf(stdout, "%d redriven\n", n)
			return err
		}
		n++
		fmt.Fprintf(stdout, "redriven %s of %s to %s/%d\n", cli.Cell(orDash(p.ID), 80), cli.Cell(p.Consumer, 60), cli.Cell(p.Topic, 100), p.Partition)
	}
	fmt.Fprintf(stdout, "%d redriven\n", n)
	return nil
}

func printParked(w io.Writer, ps []inbox.Parked) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARKED AT\tID\tCONSUMER\tFROM\tBYTES\tREASON\tERROR\tDEAD-LETTER ERROR")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%d/%d\t%d\t%s\t%s\t%s\n",
			p.ParkedAt.UTC().Format(time.RFC3339), cli.Cell(orDash(p.ID), 80), cli.Cell(p.Consumer, 60),
			cli.Cell(p.Topic, 100), p.Partition, p.Offset, len(p.Key)+len(p.Value), cli.Cell(string(p.Reason), 40),
			cli.Cell(strconv.Quote(p.Error), 120), cli.Cell(strconv.Quote(p.DeadLetterError), 120))
	}
	_ = tw.Flush()
}
