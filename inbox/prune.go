package inbox

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/dbsqlc"
)

// Defaults of PruneConfig.
const (
	InboxRetentionDefault    = 7 * 24 * time.Hour
	InboxRetentionMinDefault = 24 * time.Hour
	OutboxRetentionDefault   = 7 * 24 * time.Hour
	PruneBatchSizeDefault    = 1000
	PruneIntervalDefault     = time.Hour
)

// DBTX runs statements: *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PruneConfig configures retention. The inbox must remember a message for
// longer than any duplicate of it can arrive: the relay's in-flight window
// after a crash (seconds), a dead-letter redrive (as long as dead letters
// are kept), the overlap of a broker migration. A message redelivered after
// its inbox row is gone takes effect a second time.
type PruneConfig struct {
	// InboxRetention is the dedupe window: inbox rows processed longer ago
	// are deleted. Defaults to InboxRetentionDefault (7 days).
	InboxRetention time.Duration

	// InboxRetentionMin is the safety minimum: a shorter InboxRetention is
	// refused with ErrRetentionTooShort. Lower it only when no duplicate can
	// arrive later than the window you want. Defaults to
	// InboxRetentionMinDefault (24h).
	InboxRetentionMin time.Duration

	// OutboxRetention deletes outbox rows created longer ago. The relay
	// reads the WAL, not the table, so this only bounds how long events stay
	// queryable; a negative value keeps them forever. Defaults to
	// OutboxRetentionDefault (7 days).
	OutboxRetention time.Duration

	// BatchSize is how many rows one DELETE removes; each runs in its own
	// short transaction, so no lock is held for long. Defaults to
	// PruneBatchSizeDefault (1000).
	BatchSize int

	// Interval is how often Worker.Run prunes when Config.Prune is set.
	// Defaults to PruneIntervalDefault (1h).
	Interval time.Duration
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c PruneConfig) WithDefaults() PruneConfig {
	c.InboxRetention = cmp.Or(c.InboxRetention, InboxRetentionDefault)
	c.InboxRetentionMin = cmp.Or(c.InboxRetentionMin, InboxRetentionMinDefault)
	c.OutboxRetention = cmp.Or(c.OutboxRetention, OutboxRetentionDefault)
	c.BatchSize = cmp.Or(c.BatchSize, PruneBatchSizeDefault)
	c.Interval = cmp.Or(c.Interval, PruneIntervalDefault)
	return c
}

func (c PruneConfig) validate() error {
	switch {
	case c.InboxRetentionMin < 0:
		return fmt.Errorf("inbox: PruneConfig.InboxRetentionMin is %s: must not be negative", c.InboxRetentionMin)
	case c.InboxRetention < c.InboxRetentionMin:
		return fmt.Errorf("inbox: PruneConfig.InboxRetention %s is below PruneConfig.InboxRetentionMin %s: %w. "+
			"A message delivered again after its inbox row is deleted (a relay replaying after a crash, a dead-letter "+
			"redrive, a broker migration's overlap) would take effect twice. Keep the window longer than any such "+
			"delay, or lower the minimum deliberately",
			c.InboxRetention, c.InboxRetentionMin, ErrRetentionTooShort)
	case c.BatchSize < 1:
		return fmt.Errorf("inbox: PruneConfig.BatchSize is %d: must be at least 1", c.BatchSize)
	case c.Interval <= 0:
		return fmt.Errorf("inbox: PruneConfig.Interval is %s: must be positive", c.Interval)
	}
	return nil
}

// PruneResult counts what Prune deleted.
type PruneResult struct {
	InboxDeleted  int64
	OutboxDeleted int64
	Batches       int // DELETE statements run, over both tables
}

// Prune deletes inbox rows older than the dedupe window and outbox rows
// older than the outbox retention, BatchSize rows per statement, until none
// is left. cfg may be nil for the defaults. A window below the safety
// minimum is refused before anything is deleted.
func Prune(ctx context.Context, db DBTX, cfg *PruneConfig) (*PruneResult, error) {
	var c PruneConfig
	if cfg != nil {
		c = *cfg
	}
	c = c.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return prune(ctx, db, &c, nil)
}

func prune(ctx context.Context, db DBTX, c *PruneConfig, m *metrics) (*PruneResult, error) {
	q := dbsqlc.New()
	now := time.Now()
	res := &PruneResult{}
	batch := int32(min(c.BatchSize, 1<<30))
	n, err := deleteBatches(ctx, res, batch, func() (int64, error) {
		return q.InboxDeleteBefore(ctx, db, dbsqlc.InboxDeleteBeforeParams{Before: now.Add(-c.InboxRetention), MaxRows: batch})
	})
	res.InboxDeleted = n
	if m != nil {
		m.pruned.WithLabelValues("inbox").Add(float64(n))
	}
	if err != nil {
		return res, fmt.Errorf("inbox: prune inbox: %w", err)
	}
	if c.OutboxRetention < 0 {
		return res, nil
	}
	n, err = deleteBatches(ctx, res, batch, func() (int64, error) {
		return q.OutboxDeleteBefore(ctx, db, dbsqlc.OutboxDeleteBeforeParams{Before: now.Add(-c.OutboxRetention), MaxRows: batch})
	})
	res.OutboxDeleted = n
	if m != nil {
		m.pruned.WithLabelValues("outbox").Add(float64(n))
	}
	if err != nil {
		return res, fmt.Errorf("inbox: prune outbox: %w", err)
	}
	return res, nil
}

func deleteBatches(ctx context.Context, res *PruneResult, batch int32, del func() (int64, error)) (int64, error) {
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := del()
		if err != nil {
			return total, err
		}
		res.Batches++
		total += n
		if n < int64(batch) {
			return total, nil
		}
	}
}
