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
}

func (p *pruneFlags) register(f *cli.Flags) {
	p.retention = f.Duration("outbox-retention", relay.OutboxRetentionDefault,
		"outbox rows older than this are deleted once the slot confirmed them")
	p.batchSize = f.Int("prune-batch-size", relay.PruneBatchSizeDefault, "rows per DELETE statement")
	p.wait = f.Duration("prune-confirm-wait", relay.ConfirmWaitDefault, "how long to wait for the slot to confirm expired rows before leaving them for the next round")
}

func (p *pruneFlags) config() relay.PruneConfig {
	return relay.PruneConfig{Retention: *p.retention, BatchSize: *p.batchSize, ConfirmWait: *p.wait}
}

func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags("relay prune", stderr)
	var c common
	c.register(f)
	var p pruneFlags
	p.register(f)
	if _, err := c.parse(f, args, stderr); err != nil {
		return err
	}
	pool, err := c.db.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := p.config()
	res, err := relay.Prune(ctx, pool, c.slot, &cfg)
	if res == nil {
		return cli.Usage(err) // the settings were refused before anything ran
	}
	fmt.Fprintf(stdout, "deleted %d confirmed outbox rows in %d batches\n", res.Deleted, res.Batches)
	if errors.Is(err, relay.ErrUnconfirmed) {
		return fmt.Errorf("%w (is `relay run` running and caught up? `relay status` shows the slot)", err)
	}
	return err
}
