package relaycli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/relay"
)

// pruneFlags are the outbox retention settings `relay prune` and `relay
// run` share.
type pruneFlags struct {
	retention *time.Duration
	batchSize *int
	wait      *time.Duration
	interval  *time.Duration // run only
}

// register binds the settings; scheduled adds --prune-interval.
func (p *pruneFlags) register(f *cli.Flags, scheduled bool) {
	p.retention = f.PositiveDuration("outbox-retention", relay.OutboxRetentionDefault,
		"outbox rows older than this are deleted once the slot confirmed them")
	p.batchSize = f.Count("prune-batch-size", relay.PruneBatchSizeDefault, "rows per DELETE statement")
	p.wait = f.PositiveDuration("prune-confirm-wait", relay.ConfirmWaitDefault, "how long to wait for the slot to confirm expired rows before leaving them for the next round")
	if scheduled {
		p.interval = f.Duration("prune-interval", relay.PruneIntervalDefault, "how often to delete expired outbox rows the slot has confirmed; 0 disables")
	}
}

// config is the retention to apply; nil when --prune-interval is 0.
func (p *pruneFlags) config() *relay.PruneConfig {
	c := &relay.PruneConfig{Retention: *p.retention, BatchSize: *p.batchSize, ConfirmWait: *p.wait}
	if p.interval != nil {
		if *p.interval <= 0 {
			return nil
		}
		c.Interval = *p.interval
	}
	return c
}

func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("relay prune", stderr)
	var c common
	c.register(f)
	var p pruneFlags
	p.register(f, false)
	if err := c.parse(f, args, stderr); err != nil {
		return err
	}
	target, err := c.DB.Target()
	if err != nil {
		return err
	}
	pool, err := c.DB.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	fmt.Fprintln(stdout, target)
	res, err := relay.Prune(ctx, pool, c.slot, p.config())
	if res == nil {
		return cli.ConfigError(err, configFlags) // the settings were refused before anything ran
	}
	if res.Partitioned {
		fmt.Fprintf(stdout, "dropped %d confirmed outbox partitions, created %d ahead\n", res.PartitionsDropped, res.PartitionsCreated)
		if res.DefaultHasRows {
			fmt.Fprintln(stdout, "the default partition holds rows, which retention never drops")
		}
	} else {
		fmt.Fprintf(stdout, "deleted %d confirmed outbox rows in %d batches\n", res.Deleted, res.Batches)
	}
	if errors.Is(err, relay.ErrUnconfirmed) {
		return fmt.Errorf("%w (is `relay run` running and caught up? `relay status` shows the slot)", err)
	}
	return err
}
