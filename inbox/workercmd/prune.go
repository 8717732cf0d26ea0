package workercmd

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
)

// pruneFlags are the retention settings `worker prune` and `worker run`
// share.
type pruneFlags struct {
	inboxRetention    *durationValue
	inboxRetentionMin *durationValue
	outboxRetention   *durationValue
	batchSize         *int
}

func (p *pruneFlags) register(fs *flag.FlagSet) {
	p.inboxRetention = durationFlag(fs, "inbox-retention", "FERRY_INBOX_RETENTION", inbox.InboxRetentionDefault,
		"dedupe window: inbox rows older than this are deleted; must exceed the time any duplicate can arrive (env FERRY_INBOX_RETENTION)")
	p.inboxRetentionMin = durationFlag(fs, "inbox-retention-min", "FERRY_INBOX_RETENTION_MIN", inbox.InboxRetentionMinDefault,
		"safety minimum: a shorter --inbox-retention is refused (env FERRY_INBOX_RETENTION_MIN)")
	p.outboxRetention = durationFlag(fs, "outbox-retention", "FERRY_OUTBOX_RETENTION", inbox.OutboxRetentionDefault,
		"outbox rows older than this are deleted; negative keeps them (env FERRY_OUTBOX_RETENTION)")
	p.batchSize = fs.Int("prune-batch-size", cli.EnvInt("FERRY_PRUNE_BATCH_SIZE", inbox.PruneBatchSizeDefault),
		"rows per DELETE statement (env FERRY_PRUNE_BATCH_SIZE)")
}

func (p *pruneFlags) config() inbox.PruneConfig {
	return inbox.PruneConfig{
		InboxRetention:    p.inboxRetention.d,
		InboxRetentionMin: p.inboxRetentionMin.d,
		OutboxRetention:   p.outboxRetention.d,
		BatchSize:         *p.batchSize,
	}
}

func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := databaseURLFlag(fs)
	var l logging
	l.register(fs)
	var p pruneFlags
	p.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := needDatabaseURL(*dbURL); err != nil {
		return err
	}
	if _, err := l.logger(); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return usageError{"--database-url is not a valid PostgreSQL connection string"}
	}
	defer pool.Close()
	cfg := p.config()
	res, err := inbox.Prune(ctx, pool, &cfg)
	if res != nil && (err == nil || res.InboxDeleted+res.OutboxDeleted > 0) {
		fmt.Fprintf(stdout, "deleted %d inbox rows and %d outbox rows in %d batches\n", res.InboxDeleted, res.OutboxDeleted, res.Batches)
	}
	return err
}
