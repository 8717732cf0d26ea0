package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/outbox"
)

// Defaults of PruneConfig.
const (
	OutboxRetentionDefault = 7 * 24 * time.Hour
	PruneBatchSizeDefault  = 1000
	PruneIntervalDefault   = time.Hour
	ConfirmWaitDefault     = 30 * time.Second
)

// ErrUnconfirmed is returned, wrapped, by Prune when outbox rows are due
// for deletion but the slot has not confirmed them within
// PruneConfig.ConfirmWait: the relay is behind, stopped, or standing by.
// Nothing unconfirmed is ever deleted.
var ErrUnconfirmed = errors.New("relay: the slot has not confirmed these outbox rows yet")

// PruneConfig configures outbox retention. The relay owns it because it
// knows what it has published: a row is deleted only once it is older than
// Retention and the slot has confirmed it, so an operator can still
// republish what a lost slot missed.
type PruneConfig struct {
	// Retention: outbox rows created longer ago are deleted. Defaults to
	// OutboxRetentionDefault (7 days).
	Retention time.Duration

	// BatchSize is how many rows one DELETE removes, each in its own short
	// statement. Defaults to PruneBatchSizeDefault (1000).
	BatchSize int

	// Interval is how often Relay.Run prunes when Config.Prune is set.
	// Defaults to PruneIntervalDefault (1h).
	Interval time.Duration

	// ConfirmWait bounds how long Prune waits for the slot to confirm a
	// batch before it gives up with ErrUnconfirmed. A running relay confirms
	// within about a second. Defaults to ConfirmWaitDefault (30s).
	ConfirmWait time.Duration
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c PruneConfig) WithDefaults() PruneConfig {
	c.Retention = cmp.Or(c.Retention, OutboxRetentionDefault)
	c.BatchSize = cmp.Or(c.BatchSize, PruneBatchSizeDefault)
	c.Interval = cmp.Or(c.Interval, PruneIntervalDefault)
	c.ConfirmWait = cmp.Or(c.ConfirmWait, ConfirmWaitDefault)
	return c
}

func (c PruneConfig) validate() error {
	switch {
	case c.Retention <= 0:
		return fmt.Errorf("relay: PruneConfig.Retention is %s: must be positive", c.Retention)
	case c.BatchSize < 1:
		return fmt.Errorf("relay: PruneConfig.BatchSize is %d: must be at least 1", c.BatchSize)
	case c.Interval <= 0:
		return fmt.Errorf("relay: PruneConfig.Interval is %s: must be positive", c.Interval)
	case c.ConfirmWait <= 0:
		return fmt.Errorf("relay: PruneConfig.ConfirmWait is %s: must be positive", c.ConfirmWait)
	}
	return nil
}

// PruneResult counts what Prune deleted.
type PruneResult struct {
	Deleted int64
	Batches int // DELETE statements run

	// Partitioned: the outbox is partitioned (schema.PartitionOutbox)
	// and was pruned by partition; the counts are the partitions dropped
	// and created ahead, and DefaultHasRows tells that its default
	// partition holds rows, which retention never drops.
	Partitioned       bool
	PartitionsDropped int
	PartitionsCreated int
	DefaultHasRows    bool
}

// Prune deletes outbox rows older than cfg.Retention that slot has
// confirmed, BatchSize rows per statement, until none is left. cfg may be
// nil for the defaults. Rows committed but not yet confirmed stay: Prune
// waits up to cfg.ConfirmWait for the slot, then returns ErrUnconfirmed
// with what it deleted so far. The result is nil only when the settings
// are refused, before anything runs.
//
// A partitioned outbox (schema.PartitionOutbox) is pruned by partition
// instead (BatchSize does not apply): the partitions of the week ahead are
// created, and a day's partition is dropped only once the whole day is
// older than Retention and the slot confirmed every row in it, with the
// same ErrUnconfirmed while it has not; the default partition never.
func Prune(ctx context.Context, db outbox.DBTX, slot string, cfg *PruneConfig) (*PruneResult, error) {
	var c PruneConfig
	if cfg != nil {
		c = *cfg
	}
	c = c.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if err := checkName("slot", slot); err != nil {
		return nil, err
	}
	return prune(ctx, db, slot, &c, nil)
}

func prune(ctx context.Context, db outbox.DBTX, slot string, c *PruneConfig, m *metrics) (*PruneResult, error) {
	q := dbsqlc.New()
	partitioned, err := partition.IsPartitioned(ctx, db, partition.Outbox)
	if err != nil {
		return &PruneResult{}, fmt.Errorf("relay: prune: %w", err)
	}
	if partitioned {
		return prunePartitions(ctx, db, slot, c, m)
	}
	before := time.Now().Add(-c.Retention)
	batch := int32(min(c.BatchSize, 1<<30))
	res := &PruneResult{}
	for {
		cand, err := q.OutboxPruneCandidates(ctx, db, dbsqlc.OutboxPruneCandidatesParams{Before: before, MaxRows: batch})
		if err != nil {
			return res, fmt.Errorf("relay: prune: select expired outbox rows: %w", err)
		}
		if len(cand.Ids) == 0 {
			return res, nil
		}
		if err := waitConfirmed(ctx, db, slot, cand.WalLsn, c.ConfirmWait); err != nil {
			return res, err
		}
		n, err := q.OutboxDeleteByIDs(ctx, db, cand.Ids)
		if err != nil {
			return res, fmt.Errorf("relay: prune: delete outbox rows: %w", err)
		}
		res.Batches++
		res.Deleted += n
		if m != nil {
			m.pruned.Add(float64(n))
		}
		if len(cand.Ids) < int(batch) {
			return res, nil
		}
	}
}

// waitConfirmed polls until slot confirmed lsn, for at most wait.
func waitConfirmed(ctx context.Context, db outbox.DBTX, slot, lsn string, wait time.Duration) error {
	q := dbsqlc.New()
	deadline := time.Now().Add(wait)
	for {
		ok, err := q.ReplicationSlotConfirmed(ctx, db, dbsqlc.ReplicationSlotConfirmedParams{Lsn: lsn, SlotName: slot})
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%w: prune: slot %q does not exist, so nothing in the outbox is known to be published", ErrSlotMissing, slot)
		case err != nil:
			return fmt.Errorf("relay: prune: read slot %q: %w", slot, err)
		case ok:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("%w: slot %q has not confirmed WAL position %s after %s; expired rows stay until it does",
				ErrUnconfirmed, slot, lsn, wait)
		}
		if !sleep(ctx, min(100*time.Millisecond, wait)) {
			return ctx.Err()
		}
	}
}

// pruneLoop prunes every Interval until ctx ends.
func (r *Relay) pruneLoop(ctx context.Context, db outbox.DBTX, log *slog.Logger) {
	c := *r.cfg.Prune
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	for {
		res, err := prune(ctx, db, r.cfg.Slot, &c, r.metrics)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrUnconfirmed):
			log.Warn("outbox retention waits for the slot", slog.Int64("deleted", res.Deleted), slog.String("error", err.Error()))
		case err != nil:
			log.Error("outbox retention failed", slog.Int64("deleted", res.Deleted), slog.String("error", err.Error()))
		case res.Partitioned:
			logPartitions(log, res)
		default:
			log.Info("outbox pruned", slog.Int64("rows", res.Deleted), slog.Int("batches", res.Batches))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
