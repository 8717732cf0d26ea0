package inbox

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/pgerr"
)

// shadowWriter records a live migration's shadow copies in
// ferry_inbox_copy, many per transaction: a shadow is never applied, so a
// transaction of its own each would cost the worker as much as the
// messages it applies. A shadow's offset is finished only once it is
// recorded; until then a crash or a revoke brings it again.
type shadowWriter struct {
	w  *Worker
	in chan shadowItem
}

type shadowItem struct {
	p   *partition
	rec *kgo.Record
	row dbsqlc.InboxCopyInsertParams
}

// shadowWriters record shadows side by side (one alone fell behind the
// lanes applying messages: a backend among theirs, one transaction at a
// time), shadowBatch bounds one transaction; shadowQueue the shadows
// waiting, beyond which lanes wait (back-pressure).
const (
	shadowWriters = 2
	shadowBatch   = 500
	shadowQueue   = 4 * shadowBatch
)

func newShadowWriter(w *Worker) *shadowWriter {
	return &shadowWriter{w: w, in: make(chan shadowItem, shadowQueue)}
}

// add queues a shadow; false when the partition stopped first.
func (s *shadowWriter) add(p *partition, rec *kgo.Record, row dbsqlc.InboxCopyInsertParams) bool {
	select {
	case s.in <- shadowItem{p, rec, row}:
		return true
	case <-p.stopCtx.Done():
		return false
	}
}

// run records queued shadows until ctx ends.
func (s *shadowWriter) run(ctx context.Context) {
	for {
		var batch []shadowItem
		select {
		case <-ctx.Done():
			return
		case it := <-s.in:
			batch = append(batch, it)
		}
	more:
		for len(batch) < shadowBatch {
			select {
			case it := <-s.in:
				batch = append(batch, it)
			default:
				break more
			}
		}
		if !s.write(ctx, batch) {
			return
		}
		for _, it := range batch {
			it.p.finish(it.rec)
		}
	}
}

// write records batch in one transaction, retrying until it commits;
// false when ctx ended first. It first takes every copy for new (no ON
// CONFLICT): a copy recorded already (brought again after a revoke or a
// crash, or twice in one batch) fails that statement, and the batch is
// recorded again skipping what is there.
func (s *shadowWriter) write(ctx context.Context, batch []shadowItem) bool {
	rows := shadowRows(batch)
	fresh := true
	for failures := 1; ; failures++ {
		err := pgx.BeginFunc(ctx, s.w.cfg.DB, func(tx pgx.Tx) error {
			if fresh {
				return s.w.queries.InboxShadowInsertManyNew(ctx, tx, dbsqlc.InboxShadowInsertManyNewParams(rows))
			}
			return s.w.queries.InboxShadowInsertMany(ctx, tx, rows)
		})
		if err == nil {
			s.w.dbAnswered()
			return true
		}
		if fresh && pgerr.Is(err, pgerrcode.UniqueViolation) {
			fresh, failures = false, 0
			continue
		}
		wait := backoff.Delay(failures, s.w.cfg.RetryBackoff, s.w.cfg.RetryBackoffMax)
		s.w.cfg.Logger.Warn("live migration: cannot record shadow copies; retrying", slog.Int("copies", len(batch)),
			slog.Duration("retry_in", wait), slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}

// shadowRows sorts batch by the copies' keys (what order its caller holds
// them in does not matter) and returns it as InboxShadowInsertMany's
// arrays: the writers' transactions then lock the keys they share (a shadow
// brought again while its first delivery waits in the queue) in one order,
// and never wait on each other in a cycle.
func shadowRows(batch []shadowItem) dbsqlc.InboxShadowInsertManyParams {
	slices.SortFunc(batch, func(a, b shadowItem) int {
		return cmp.Or(cmp.Compare(a.row.Consumer, b.row.Consumer), cmp.Compare(a.row.MessageID, b.row.MessageID),
			cmp.Compare(a.row.Side, b.row.Side))
	})
	var rows dbsqlc.InboxShadowInsertManyParams
	for _, it := range batch {
		r := &it.row
		rows.Consumers = append(rows.Consumers, r.Consumer)
		rows.MessageIds = append(rows.MessageIds, r.MessageID)
		rows.Plans = append(rows.Plans, r.Plan)
		rows.Sides = append(rows.Sides, r.Side)
		rows.Epochs = append(rows.Epochs, r.Epoch)
		rows.Digests = append(rows.Digests, r.Digest)
		rows.ReceivedAts = append(rows.ReceivedAts, r.ReceivedAt)
		rows.Topics = append(rows.Topics, r.Topic.String)
		rows.Partitions = append(rows.Partitions, r.Partition.Int32)
		rows.RecordOffsets = append(rows.RecordOffsets, r.RecordOffset.Int64)
		rows.RecordKeys = append(rows.RecordKeys, r.RecordKey)
		rows.RecordValues = append(rows.RecordValues, r.RecordValue)
		rows.RecordHeaders = append(rows.RecordHeaders, r.RecordHeaders)
	}
	return rows
}
