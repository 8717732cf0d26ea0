package workercli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
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
received and whose authoritative copy will not come (the consumer read the
partition it was written to past where it would be, and did not find it:
lost on the other channel) waits in the worker database's
ferry_inbox_quarantine table. Replay publishes each again to the
topic and partition its shadow came from, without the route stamp, so the
consumer applies it (once: its id is in the inbox afterwards), and deletes
it from the table. A shadow from the old channel goes back there through
the --kafka-* settings (--rabbitmq-* for a RabbitMQ old channel: to the
consumer's own shard queue); one from the new channel through the channel
the consumer learned (ferry_inbox_channel), of either kind. An event that left the quarantine
meanwhile (its authoritative copy came late and was applied) needs no
replay and is counted apart. Replay exits 0 when every event selected was
replayed or had left the quarantine, 1 when one could not be replayed: it
is named, stays quarantined, and replaying again is harmless.
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
	var rabbit cli.RabbitMQ
	// No environment variables for the selection, as for dead letters.
	consumer := f.FlagSet.String("consumer", "", "only the events of this consumer")
	id, all := new(string), new(bool)
	if action == "replay" {
		kafka.Register(f, "ferry-worker-migration")
		rabbit.Register(f, "ferry-worker-migration")
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
	var old channelReplay
	if rabbit.Enabled() {
		old.rabbit = rabbitConnection(&rabbit)
	} else if old.opts, err = kafka.Opts(nil); err != nil {
		return err
	}
	var selected, replayed, gone, failed int
	channels := map[[2]string]channelReplay{} // by consumer and plan: one reading of each
	for i, q := range qs {
		if *id != "" && q.ID != *id {
			continue
		}
		selected++
		what := cli.Cell(q.ID, 80) + " of " + cli.Cell(q.Consumer, 60)
		if ctx.Err() != nil {
			// --timeout ran out: what is left is not tried, and says so once.
			left := 0
			for _, r := range qs[i:] {
				if *id == "" || r.ID == *id {
					left++
				}
			}
			why := ctx.Err().Error()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				why = fmt.Sprintf("--timeout %s ran out (replay again, or with a longer --timeout)", *timeout)
			}
			fmt.Fprintf(stdout, "%d not tried: %s\n", left, why)
			failed += left
			selected += left - 1
			break
		}
		err := replayOne(ctx, pool, old, channels, q)
		switch {
		case errors.Is(err, inbox.ErrNoLongerQuarantined):
			// Applied meanwhile (its authoritative copy came late), or
			// replayed by another: nothing is left to do.
			gone++
			fmt.Fprintf(stdout, "%s: no longer quarantined (applied meanwhile, or replayed already): nothing to do\n", what)
		case err != nil:
			failed++
			fmt.Fprintf(stdout, "%s: not replayed: %s\n", what, cli.Cell(err.Error(), 500))
		default:
			replayed++
			fmt.Fprintf(stdout, "replayed %s to the %s channel's %s/%d\n", what, q.Side, cli.Cell(q.Topic, 100), q.Partition)
		}
	}
	if *id != "" && selected == 0 {
		return fmt.Errorf("no quarantined event with id %q%s", *id, map[bool]string{true: " of consumer " + *consumer}[*consumer != ""])
	}
	fmt.Fprintf(stdout, "%d replayed, %d no longer quarantined, %d failed\n", replayed, gone, failed)
	if failed > 0 {
		return fmt.Errorf("%d of %d quarantined events not replayed (see above); they stay quarantined, and replaying again is harmless", failed, selected)
	}
	return nil
}

// channelReplay reaches a channel to replay to: Kafka's options, or a
// RabbitMQ connection; or why it cannot.
type channelReplay struct {
	opts   []kgo.Opt
	rabbit *inbox.RabbitMQConfig
	err    error
}

func (c channelReplay) replay(ctx context.Context, pool dbsqlc.DBTX, q inbox.MigrationQuarantined) error {
	if c.rabbit != nil {
		return inbox.ReplayMigrationQuarantinedRabbitMQ(ctx, pool, c.rabbit, q)
	}
	return inbox.ReplayMigrationQuarantined(ctx, pool, c.opts, q)
}

// replayOne replays q through the channel it came from. An event whose
// new channel cannot be reached from here, but which left the quarantine
// anyway, needs no replay: ErrNoLongerQuarantined.
func replayOne(ctx context.Context, pool dbsqlc.DBTX, old channelReplay, channels map[[2]string]channelReplay, q inbox.MigrationQuarantined) error {
	if q.Side != migration.NewSide {
		return old.replay(ctx, pool, q)
	}
	key := [2]string{q.Consumer, q.Plan}
	ch, ok := channels[key]
	if !ok {
		ch = newChannel(ctx, pool, q)
		channels[key] = ch
	}
	if ch.err != nil {
		held, err := dbsqlc.New().InboxQuarantineHolds(ctx, pool, dbsqlc.InboxQuarantineHoldsParams{Consumer: q.Consumer, MessageID: q.ID})
		if err == nil && !held {
			return inbox.ErrNoLongerQuarantined
		}
		return ch.err
	}
	return ch.replay(ctx, pool, q)
}

// newChannel reaches the new channel of q's plan, as its consumer learned
// it from the old channel's fences.
func newChannel(ctx context.Context, db dbsqlc.DBTX, q inbox.MigrationQuarantined) channelReplay {
	rows, err := dbsqlc.New().InboxChannels(ctx, db, q.Consumer)
	if err != nil {
		return channelReplay{err: fmt.Errorf("read the channels of consumer %s: %w", q.Consumer, err)}
	}
	for _, r := range rows {
		if r.Plan == q.Plan && r.Side == string(migration.OldSide) {
			var ch migration.Channel
			if err := json.Unmarshal(r.Channel, &ch); err != nil {
				return channelReplay{err: fmt.Errorf("migration %s: the new channel of consumer %s: %w", q.Plan, q.Consumer, err)}
			}
			if ch.KindOf() == migration.RabbitMQ {
				return channelReplay{rabbit: &inbox.RabbitMQConfig{URL: ch.URL, Password: os.Getenv(ch.PasswordEnv),
					TLSCAFile: ch.TLSCAFile, TLSCertFile: ch.TLSCertFile, TLSKeyFile: ch.TLSKeyFile, Shards: ch.Shards, Name: "ferry-worker-migration"}}
			}
			opts, err := ch.KafkaOpts("new", nil)
			return channelReplay{opts: opts, err: err}
		}
	}
	return channelReplay{err: fmt.Errorf("migration %s: consumer %s never learned the new channel (ferry_inbox_channel)", q.Plan, q.Consumer)}
}
