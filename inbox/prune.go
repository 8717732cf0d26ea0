package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	tablepart "github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/outbox"
)

// Defaults of PruneConfig.
const (
	InboxRetentionDefault    = 7 * 24 * time.Hour
	InboxRetentionMinDefault = 24 * time.Hour
	PruneBatchSizeDefault    = 1000
	PruneIntervalDefault     = time.Hour
)

// The dedupe window a live broker migration requires. Each event then
// comes twice, once per channel, and the worker records when each copy
// arrived (ferry_inbox_copy). Before a prune pass deletes anything it reads,
// per consumer, the largest delay between the two copies of one message
// whose later copy arrived within DedupeWindowLookback, and requires an
// InboxRetention of at least the larger of twice that delay and the delay
// plus DedupeWindowMargin: the next delay may be longer than the longest
// seen so far, and a delay of seconds needs a margin of more than seconds.
const (
	// DedupeWindowLookback is how far back the delays count, by the
	// arrival of a message's later copy: a delay is seen as soon as it
	// ends, however long it was, and stops counting a week after, so a
	// finished migration does not hold retention forever.
	DedupeWindowLookback = 7 * 24 * time.Hour
	// DedupeWindowMargin is the least margin above the largest delay.
	DedupeWindowMargin = time.Hour
)

// dedupeWindow is the shortest retention that delay allows.
func dedupeWindow(delay time.Duration) time.Duration {
	return max(2*delay, delay+DedupeWindowMargin)
}

// DedupeWindowError is a consumer whose inbox a prune pass kept whole: its
// retention is below the dedupe window that its live migration's delays
// require (see DedupeWindowLookback). It wraps ErrRetentionTooShort.
type DedupeWindowError struct {
	Consumer  string
	Delay     time.Duration // the largest delay seen between the two copies of a message
	Window    time.Duration // the retention that delay requires
	Retention time.Duration // PruneConfig.InboxRetention
}

func (e *DedupeWindowError) Error() string {
	return fmt.Sprintf("inbox: prune refused for consumer %q: PruneConfig.InboxRetention %s is below the dedupe window %s "+
		"that its live migration requires: the two copies of one message arrived up to %s apart on the old and new channels "+
		"(ferry_inbox_copy, pairs completed in the last %s), and the window is the larger of twice that and that plus %s. "+
		"A copy arriving after its message's inbox row is deleted would take effect twice, so none of the consumer's "+
		"inbox rows was deleted: raise the retention to %s or more",
		e.Consumer, e.Retention, e.Window, e.Delay, DedupeWindowLookback, DedupeWindowMargin, e.Window)
}

func (e *DedupeWindowError) Unwrap() error { return ErrRetentionTooShort }

// PruneConfig configures inbox retention. (Outbox retention is the
// relay's: it knows which rows it has confirmed.) The inbox must remember a message for
// longer than any duplicate of it can arrive: the relay's in-flight window
// after a crash (seconds), a dead-letter redrive (as long as dead letters
// are kept), the overlap of a broker migration. A message redelivered after
// its inbox row is gone takes effect a second time. During a live
// migration the overlap is measured: a consumer whose retention is below
// its dedupe window (DedupeWindowLookback) is not pruned at all.
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
	Deleted int64 // inbox rows
	Batches int   // DELETE statements run

	// CopiesDeleted: rows of ferry_inbox_copy, the copies of settled
	// events of live migrations whose copies all came longer ago than
	// both InboxRetention and DedupeWindowLookback.
	CopiesDeleted int64

	// Partitioned: the inbox is partitioned (schema.PartitionInbox) and
	// was pruned by partition. Retention is the window applied: the
	// longer of InboxRetention and the dedupe window of every consumer
	// that needs more (they share the partitions). The counts are the
	// partitions dropped and created ahead; DefaultHasRows tells that the
	// default partition holds rows, which retention never drops.
	Partitioned       bool
	Retention         time.Duration
	PartitionsDropped int
	PartitionsCreated int
	DefaultHasRows    bool
}

// Prune deletes inbox rows older than the dedupe window, BatchSize rows per
// statement, until none is left. cfg may be nil for the defaults. A window
// below the safety minimum is refused before anything is deleted. The
// result is nil only when the settings are refused, before anything runs.
//
// A consumer whose retention is below its live migration's dedupe window
// keeps every inbox row; the others are pruned, and the error then joins
// a *DedupeWindowError (wrapping ErrRetentionTooShort) per consumer kept.
// So does a pass of Run, which logs it. When the window cannot be read
// (the role lacks SELECT on ferry_inbox_copy), nothing is deleted.
//
// A partitioned inbox (schema.PartitionInbox) is pruned by partition
// instead: the partitions of the week ahead are created, and a day's
// partition is dropped once the whole day is older than the longest of
// InboxRetention and every consumer's dedupe window (PruneResult.Retention),
// never the default partition.
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
	now := time.Now()
	res := &PruneResult{}
	refusals, err := dedupeWindowRefusals(ctx, q, db, c.InboxRetention, now)
	if err != nil {
		return res, err
	}
	partitioned, err := tablepart.IsPartitioned(ctx, db, tablepart.Inbox)
	if err != nil {
		return res, fmt.Errorf("inbox: prune: %w", err)
	}
	// Not nil: pgx sends a nil slice as NULL, and "<> ALL(NULL)" keeps
	// every row.
	keep := make([]string, 0, len(refusals))
	for _, r := range refusals {
		keep = append(keep, r.Consumer)
	}
	copies, copyErr := pruneCopies(ctx, q, db, c, m, keep, now)
	if partitioned {
		res, err := prunePartitioned(ctx, db, c, m, refusals, now)
		res.CopiesDeleted = copies
		return res, errors.Join(err, copyErr)
	}
	res.CopiesDeleted = copies
	errs := []error{copyErr}
	for _, r := range refusals {
		errs = append(errs, r)
		if m != nil {
			m.pruneRefused.WithLabelValues(r.Consumer).Inc()
		}
	}
	refused := errors.Join(errs...)
	before := now.Add(-c.InboxRetention)
	batch := int32(min(c.BatchSize, 1<<30))
	for {
		if err := ctx.Err(); err != nil {
			return res, errors.Join(refused, err)
		}
		n, err := q.InboxDeleteBeforeExcept(ctx, db, dbsqlc.InboxDeleteBeforeExceptParams{Before: before, Keep: keep, MaxRows: batch})
		if err != nil {
			return res, errors.Join(refused, fmt.Errorf("inbox: prune: %w", err))
		}
		res.Batches++
		res.Deleted += n
		if m != nil {
			m.pruned.WithLabelValues("inbox").Add(float64(n))
		}
		if n < int64(batch) {
			return res, refused
		}
	}
}

// pruneCopies deletes the copies of live migrations (ferry_inbox_copy)
// of every settled event whose copies all came longer ago than both the
// retention and DedupeWindowLookback (the dedupe window reads the delays
// of that long), BatchSize copies read per statement, and returns how many
// it deleted. The consumers in keep (refused a prune: their copies say
// why) keep theirs, and so does an event nothing settled yet. Before, no
// copy was ever deleted: each message of a migration left two rows for
// good, which every prune pass's dedupe window then read.
func pruneCopies(ctx context.Context, q *dbsqlc.Queries, db outbox.DBTX, c *PruneConfig, m *metrics, keep []string, now time.Time) (int64, error) {
	plans, err := q.InboxCopyPlansRecorded(ctx, db)
	if err != nil {
		return 0, copyPruneError(err)
	}
	var deleted int64
	batch := int32(min(c.BatchSize, 1<<30))
	for _, p := range plans {
		if slices.Contains(keep, p.Consumer) {
			continue
		}
		arg := dbsqlc.InboxCopyPruneParams{Consumer: p.Consumer, Plan: p.Plan, MaxRows: batch,
			Before: now.Add(-max(c.InboxRetention, DedupeWindowLookback))}
		for {
			if err := ctx.Err(); err != nil {
				return deleted, err
			}
			r, err := q.InboxCopyPrune(ctx, db, arg)
			if err != nil {
				return deleted, copyPruneError(err)
			}
			deleted += r.Deleted
			if m != nil {
				m.pruned.WithLabelValues("ferry_inbox_copy").Add(float64(r.Deleted))
			}
			if r.Read < batch {
				break
			}
			arg.AfterAt, arg.AfterID, arg.AfterSide = r.LastAt, r.LastID, r.LastSide
		}
	}
	return deleted, nil
}

func copyPruneError(err error) error {
	return fmt.Errorf("inbox: prune: delete the copies of live migrations past the dedupe window (ferry_inbox_copy; "+
		"the role needs DELETE on it for retention): %w", err)
}

// dedupeWindowRefusals returns the consumers whose inbox must be kept
// whole: their live migration's dedupe window exceeds retention.
func dedupeWindowRefusals(ctx context.Context, q *dbsqlc.Queries, db outbox.DBTX, retention time.Duration, now time.Time) ([]*DedupeWindowError, error) {
	rows, err := q.InboxCopyMaxDelays(ctx, db, now.Add(-DedupeWindowLookback))
	if err != nil {
		return nil, fmt.Errorf("inbox: prune: read the delays between the copies of live migrations (ferry_inbox_copy), "+
			"without which no inbox row is deleted: %w", err)
	}
	var refusals []*DedupeWindowError
	for _, r := range rows {
		delay := time.Duration(r.DelayMicros) * time.Microsecond
		if window := dedupeWindow(delay); retention < window {
			refusals = append(refusals, &DedupeWindowError{Consumer: r.Consumer, Delay: delay, Window: window, Retention: retention})
		}
	}
	return refusals, nil
}
