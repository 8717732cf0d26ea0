package workercli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/migration"
)

const migrationUsage = `Usage:
  %[1]s migration quarantine list [--consumer C]
  %[1]s migration quarantine replay (--consumer C | --all) [--id ID]

During a live broker migration, an event whose shadow copy a consumer
received and whose authoritative copy it never applied (lost on the other
channel, or late beyond --migration-quarantine-after) waits in the worker
database's ferry_inbox_quarantine table. Replay publishes each again to the
topic and partition its shadow came from, without the route stamp, so the
consumer applies it (once: its id is in the inbox afterwards), and deletes
it from the table. A shadow from the old channel goes back there through
the --kafka-* settings; one from the new channel through the channel the
consumer learned (ferry_inbox_channel).
`

// runMigration is `migration quarantine list|replay`.
func runMigration(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	if (len(args) > 0 && cli.IsHelp(args[0])) || (len(args) > 1 && args[0] == "quarantine" && cli.IsHelp(args[1])) {
		fmt.Fprintf(stdout, migrationUsage, name)
		return nil
	}
	if len(args) < 2 || args[0] != "quarantine" || (args[1] != "list" && args[1] != "replay") {
		fmt.Fprintf(stderr, migrationUsage, name)
		return cli.Usagef("want migration quarantine list or migration quarantine replay")
	}
	action := args[1]
	f := cli.NewFlags(name+" migration quarantine "+action, stderr)
	var base cli.Base
	base.Register(f)
	var kafka cli.Kafka
	// No environment variables for the selection, as for dead letters.
	consumer := f.FlagSet.String("consumer", "", "only the events of this consumer")
	id, all := new(string), new(bool)
	if action == "replay" {
		kafka.Register(f, "ferry-worker-migration")
		f.FlagSet.StringVar(id, "id", "", "only the event with this id")
		f.FlagSet.BoolVar(all, "all", false, "every quarantined event")
	}
	timeout := f.FlagSet.Duration("timeout", time.Minute, "give up after this long")
	if _, err := base.Parse(f, args[2:], stderr); err != nil {
		return err
	}
	if action == "replay" && *consumer == "" && !*all {
		return cli.Usagef("replay needs --consumer C or --all")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	pool, err := base.DB.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	qs, err := inbox.ListMigrationQuarantined(ctx, pool, *consumer)
	if err != nil {
		return err
	}
	if action == "list" {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "QUARANTINED AT\tID\tCONSUMER\tPLAN\tFROM\tBYTES\tREASON")
		for _, q := range qs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s %s/%d/%d\t%d\t%s\n", q.At.UTC().Format(time.RFC3339), cli.Cell(q.ID, 80),
				cli.Cell(q.Consumer, 60), cli.Cell(q.Plan, 63), q.Side, cli.Cell(q.Topic, 100), q.Partition, q.Offset,
				len(q.Key)+len(q.Value), cli.Cell(q.Reason, 120))
		}
		_ = tw.Flush()
		fmt.Fprintf(stdout, "%d quarantined events\n", len(qs))
		return nil
	}
	oldOpts, err := kafka.Opts(nil)
	if err != nil {
		return err
	}
	n := 0
	for _, q := range qs {
		if *id != "" && q.ID != *id {
			continue
		}
		opts := oldOpts
		if q.Side == migration.NewSide {
			if opts, err = newChannelOpts(ctx, pool, q); err != nil {
				fmt.Fprintf(stdout, "%d replayed\n", n)
				return err
			}
		}
		err := inbox.ReplayMigrationQuarantined(ctx, pool, opts, q)
		if errors.Is(err, inbox.ErrNoLongerQuarantined) {
			fmt.Fprintf(stdout, "%s of %s: %v\n", cli.Cell(q.ID, 80), cli.Cell(q.Consumer, 60), inbox.ErrNoLongerQuarantined)
			continue
		}
		if err != nil {
			fmt.Fprintf(stdout, "%d replayed\n", n)
			return err
		}
		n++
		fmt.Fprintf(stdout, "replayed %s of %s to the %s channel's %s/%d\n", cli.Cell(q.ID, 80), cli.Cell(q.Consumer, 60),
			q.Side, cli.Cell(q.Topic, 100), q.Partition)
	}
	if *id != "" && n == 0 {
		return fmt.Errorf("no quarantined event with id %q%s", *id, map[bool]string{true: " of consumer " + *consumer}[*consumer != ""])
	}
	fmt.Fprintf(stdout, "%d replayed\n", n)
	return nil
}

// newChannelOpts reaches the new channel of q's plan, as its consumer
// learned it from the old channel's fences.
func newChannelOpts(ctx context.Context, db dbsqlc.DBTX, q inbox.MigrationQuarantined) ([]kgo.Opt, error) {
	rows, err := dbsqlc.New().InboxChannels(ctx, db, q.Consumer)
	if err != nil {
		return nil, fmt.Errorf("read the channels of consumer %s: %w", q.Consumer, err)
	}
	for _, r := range rows {
		if r.Plan == q.Plan && r.Side == string(migration.OldSide) {
			var ch migration.Channel
			if err := json.Unmarshal(r.Channel, &ch); err != nil {
				return nil, fmt.Errorf("migration %s: the new channel of consumer %s: %w", q.Plan, q.Consumer, err)
			}
			return ch.KafkaOpts("new", nil)
		}
	}
	return nil, fmt.Errorf("migration %s: consumer %s never learned the new channel (ferry_inbox_channel)", q.Plan, q.Consumer)
}
