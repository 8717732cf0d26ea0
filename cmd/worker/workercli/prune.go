package workercli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
)

// pruneFlags are the inbox retention settings `prune` and `run` share.
// Outbox retention is the relay's (`relay prune`): it knows what it has
// confirmed.
type pruneFlags struct {
	inboxRetention    *time.Duration
	inboxRetentionMin *time.Duration
	batchSize         *int
	interval          *time.Duration // run only
}

// register binds the settings; scheduled adds --prune-interval.
func (p *pruneFlags) register(f *cli.Flags, scheduled bool) {
	p.inboxRetention = f.PositiveDuration("inbox-retention", inbox.InboxRetentionDefault,
		"dedupe window: inbox rows older than this are deleted; must exceed the time any duplicate can arrive")
	p.inboxRetentionMin = f.PositiveDuration("inbox-retention-min", inbox.InboxRetentionMinDefault,
		"safety minimum: a shorter --inbox-retention is refused")
	p.batchSize = f.Count("prune-batch-size", inbox.PruneBatchSizeDefault, "rows per DELETE statement")
	if scheduled {
		p.interval = f.Duration("prune-interval", inbox.PruneIntervalDefault, "how often to prune expired inbox rows; 0 disables")
	}
}

// config is the retention to apply; nil when --prune-interval is 0.
func (p *pruneFlags) config() *inbox.PruneConfig {
	c := &inbox.PruneConfig{
		InboxRetention:    *p.inboxRetention,
		InboxRetentionMin: *p.inboxRetentionMin,
		BatchSize:         *p.batchSize,
	}
	if p.interval != nil {
		if *p.interval <= 0 {
			return nil
		}
		c.Interval = *p.interval
	}
	return c
}

func runPrune(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags(name+" prune", stderr)
	var base cli.Base
	base.Register(f)
	var p pruneFlags
	p.register(f, false)
	if _, err := base.Parse(f, args, stderr); err != nil {
		return err
	}
	target, err := base.DB.Target()
	if err != nil {
		return err
	}
	pool, err := base.DB.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	fmt.Fprintln(stdout, target)
	res, err := inbox.Prune(ctx, pool, p.config())
	if res == nil {
		return cli.ConfigError(err, configFlags) // the settings were refused before anything ran
	}
	if res.Partitioned {
		fmt.Fprintf(stdout, "dropped %d inbox partitions older than %s, created %d ahead\n", res.PartitionsDropped, res.Retention, res.PartitionsCreated)
		if res.DefaultHasRows {
			fmt.Fprintln(stdout, "the default partition holds rows, which retention never drops")
		}
	} else {
		fmt.Fprintf(stdout, "deleted %d inbox rows in %d batches\n", res.Deleted, res.Batches)
	}
	if res.CopiesDeleted > 0 {
		fmt.Fprintf(stdout, "deleted %d copies of live migrations' settled events (ferry_inbox_copy)\n", res.CopiesDeleted)
	}
	return err
}
