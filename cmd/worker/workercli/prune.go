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
}

func (p *pruneFlags) register(f *cli.Flags) {
	p.inboxRetention = f.Duration("inbox-retention", inbox.InboxRetentionDefault,
		"dedupe window: inbox rows older than this are deleted; must exceed the time any duplicate can arrive")
	p.inboxRetentionMin = f.Duration("inbox-retention-min", inbox.InboxRetentionMinDefault,
		"safety minimum: a shorter --inbox-retention is refused")
	p.batchSize = f.Int("prune-batch-size", inbox.PruneBatchSizeDefault, "rows per DELETE statement")
}

func (p *pruneFlags) config() inbox.PruneConfig {
	return inbox.PruneConfig{
		InboxRetention:    *p.inboxRetention,
		InboxRetentionMin: *p.inboxRetentionMin,
		BatchSize:         *p.batchSize,
	}
}

func runPrune(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	f := cli.NewFlags(name+" prune", stderr)
	var db cli.Database
	db.Register(f)
	var log cli.Log
	log.Register(f)
	var p pruneFlags
	p.register(f)
	if err := f.Parse(args); err != nil {
		return err
	}
	if _, err := log.Logger(stderr); err != nil {
		return err
	}
	pool, err := db.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := p.config()
	res, err := inbox.Prune(ctx, pool, &cfg)
	if res == nil {
		return cli.Usage(err) // the settings were refused before anything ran
	}
	fmt.Fprintf(stdout, "deleted %d inbox rows in %d batches\n", res.InboxDeleted, res.Batches)
	return err
}
