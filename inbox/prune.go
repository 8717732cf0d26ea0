package inbox

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/outbox"
)

// Defaults of PruneConfig.
const (
	InboxRetentionDefault    = 7 * 24 * time.Hour
	InboxRetentionMinDefault = 24 * time.Hour
	PruneBatchSizeDefault    = 1000
	PruneIntervalDefault     = time.Hour
)

// PruneConfig configures inbox retention. (Outbox retention is the
// relay's: it knows which rows it has confirmed.) The inbox must remember a message for
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
	InboxDeleted int64
	Batches      int // DELETE statements run
}

// Prune deletes inbox rows older than the dedupe window, BatchSize rows per
// statement, until none is left. cfg may be nil for the defaults. A window
// below the safety minimum is refused before anything is deleted. The
// result is nil only when the settings are refused, before anything runs.
func Prune(ctx context.Context, db outbox.DBTX, cfg *PruneConfig) (*PruneResult, error) {
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

func prune(ctx context.Context, db outbox.DBTX, c *PruneConfig, m *metrics) (*PruneResult, error) {
	q := dbsqlc.New()
	before := time.Now().Add(-c.InboxRetention)
	batch := int32(min(c.BatchSize, 1<<30))
	res := &PruneResult{}
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		n, err := q.InboxDeleteBefore(ctx, db, dbsqlc.InboxDeleteBeforeParams{Before: before, MaxRows: batch})
		if err != nil {
			return res, fmt.Errorf("inbox: prune: %w", err)
		}
		res.Batches++
		res.InboxDeleted += n
		if m != nil {
			m.pruned.WithLabelValues("inbox").Add(float64(n))
		}
		if n < int64(batch) {
			return res, nil
		}
	}
}
