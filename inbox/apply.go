package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/pgerr"
	"github.com/ferryhq/ferry/internal/route"
)

// delivery is a message on its way to a final state: applied, skipped as a
// duplicate, or dead-lettered.
type delivery struct {
	m         *Message
	rec       *kgo.Record
	failures  int                           // handler failures so far (databaseAtFault failures do not count)
	lastErr   error                         // the last handler failure
	permanent error                         // a Permanent error the handler returned inside a batch
	route     *route.Stamp                  // a live migration's authoritative copy; nil outside one
	copyRow   *dbsqlc.InboxCopyInsertParams // its ferry_inbox_copy row, written in the transaction
	locks     []string                      // the shared resources its handler locks (HandleOpts.Locks)
	drainWork bool                          // work a RabbitMQ old channel's drain waits for (migration_old_work.go)
	locksErr  error                         // HandleOpts.Locks panicked: the attempt fails without the handler
	span      trace.Span                    // its consumer span, from its first handler call until it is settled (tracing.go)
}

// outcome is how one transaction ended.
type outcome int

const (
	outcomeApplied   outcome = iota // committed with the effect
	outcomeDuplicate                // the inbox had the message: committed without the handler
	outcomeFailed                   // the handler (or its commit) failed: counts as an attempt
	outcomeDatabase                 // the database failed (databaseAtFault): retried without counting
	outcomeBroken                   // a batch transaction cannot go on: apply one by one
	outcomeStopped                  // the partition was cancelled
)

var errHandlerTimeout = errors.New("handler timed out")

// savepoint statements of batches: one simple-protocol round trip per
// message releases the previous savepoint and sets the next.
const (
	savepointFirst    = "SAVEPOINT ferry_message"
	savepointNext     = "RELEASE SAVEPOINT ferry_message; SAVEPOINT ferry_message"
	savepointRollback = "ROLLBACK TO SAVEPOINT ferry_message"

	savepointCopies         = "SAVEPOINT ferry_copies"
	savepointCopiesRollback = "ROLLBACK TO SAVEPOINT ferry_copies"
)

// apply takes a lane's records to a final state, in order. It returns false
// when the partition stopped first; records not finished then stay
// uncommitted and come again to the next owner.
func (p *partition) apply(batch []fetched) bool {
	ds := make([]*delivery, 0, len(batch))
	for _, f := range batch {
		st, fence, err := routeOf(f.rec)
		if err != nil {
			if !p.deadLetter(f.rec, "", ReasonUndecodable, fmt.Errorf("migration headers: %w", err), 0) {
				return false
			}
			p.finish(f.rec)
			continue
		}
		work := fence == nil && p.drainWork(st)
		if work {
			p.w.oldWork.touch(p.g.name)
		}
		if fence != nil || (st != nil && st.Since > 0) {
			// A fence waits for every earlier record of the partition, a
			// copy for the other channel's fences: what the batch holds
			// before them is applied first (a fence would otherwise wait
			// for records its own batch holds back).
			if !p.applyDeliveries(ds) {
				return false
			}
			ds = ds[:0]
		}
		if st != nil || fence != nil {
			if applyIt, ok := p.followRoute(f, st, fence); !ok {
				return false
			} else if !applyIt {
				continue
			}
		}
		m, bad := newMessage(p.g.name, f.rec, p.w.cfg.IDFromPayloadHash, f.received)
		if bad != nil {
			if !p.deadLetter(f.rec, "", bad.reason, bad.err, 0) {
				return false
			}
			p.finish(f.rec)
			continue
		}
		d := &delivery{m: m, rec: f.rec, route: st, drainWork: work}
		d.locks, d.locksErr = p.locksOf(m)
		if st != nil {
			if row, ok := p.copyParams(f, st); ok {
				d.copyRow = &row
			}
		}
		ds = append(ds, d)
	}
	return p.applyDeliveries(ds)
}

// applyDeliveries applies ds, in one transaction or one each.
func (p *partition) applyDeliveries(ds []*delivery) bool {
	if len(ds) == 0 {
		return true
	}
	if p.w.cfg.unsafeCommitBeforeDB {
		p.g.src.settleFirst(p, ds)
	}
	if len(ds) == 1 {
		return p.settle(ds[0])
	}
	return p.applyBatch(ds)
}

// applyEach settles deliveries one transaction each, in order.
func (p *partition) applyEach(ds []*delivery) bool {
	for _, d := range ds {
		if !p.settle(d) {
			return false
		}
	}
	return true
}

// settle applies d in its own transaction, retrying handler failures with
// backoff up to MaxAttempts and database failures (unreachable, deadlock,
// serialization failure) without limit, and dead-letters it when it cannot
// succeed.
func (p *partition) settle(d *delivery) bool {
	cfg := &p.w.cfg
	switch {
	case d.permanent != nil:
		return p.deadLetterDelivery(d, permanentReason(d.permanent), d.permanent)
	case d.failures >= cfg.MaxAttempts:
		return p.deadLetterDelivery(d, ReasonRetriesExhausted, d.lastErr)
	case d.failures > 0 && p.rmq != nil && cfg.unsafeRequeueRetries:
		return p.requeue(d) // a failure inside a batch
	case d.failures > 0:
		p.metrics.retry()
		wait := backoff.Delay(d.failures, cfg.RetryBackoff, cfg.RetryBackoffMax)
		d.retrying(spanEventRetry, wait)
		if !p.sleep(wait) {
			return false
		}
	}
	dbFailures := 0
	for {
		if p.stopCtx.Err() != nil {
			return false
		}
		slot, ok := p.w.acquire(p.stopCtx.Done())
		if !ok {
			return false
		}
		out, err := p.applyOne(d)
		p.w.release(slot)
		switch out {
		case outcomeApplied:
			p.w.dbAnswered()
			p.metrics.addProcessed(1)
			p.finish(d.rec)
			d.endSpan(outcomeAppliedName, nil)
			return true
		case outcomeDuplicate:
			p.w.dbAnswered()
			p.metrics.addDuplicates(1)
			if d.route != nil {
				p.w.metrics.migrationDuplicates.WithLabelValues(p.g.name, string(d.route.Side)).Inc()
			}
			p.finish(d.rec)
			d.endSpan(outcomeAppliedName, nil) // by an earlier call whose commit seemed to fail
			return true
		case outcomeStopped:
			return false
		case outcomeFailed:
			if IsPermanent(err) {
				return p.deadLetterDelivery(d, permanentReason(err), err)
			}
			d.failures++
			d.lastErr = err
			if p.rmq != nil && cfg.unsafeRequeueRetries {
				return p.requeue(d)
			}
			if d.failures >= cfg.MaxAttempts {
				return p.deadLetterDelivery(d, ReasonRetriesExhausted, err)
			}
			wait := backoff.Delay(d.failures, cfg.RetryBackoff, cfg.RetryBackoffMax)
			p.log.Warn("handler failed; retrying", slog.String("id", d.m.ID), slog.Int64("offset", d.rec.Offset),
				slog.Int("attempt", d.m.Attempt), slog.Duration("retry_in", wait), slog.String("error", errorText(err)))
			p.metrics.retry()
			d.retrying(spanEventRetry, wait)
			if !p.sleep(wait) {
				return false
			}
		default: // outcomeDatabase
			dbFailures++
			p.metrics.databaseError()
			wait := backoff.Delay(dbFailures, cfg.RetryBackoff, cfg.RetryBackoffMax)
			p.log.Warn(databaseFailure(err)+"; retrying without counting an attempt", slog.String("id", d.m.ID),
				slog.Int64("offset", d.rec.Offset), slog.Duration("retry_in", wait), slog.String("error", errorText(err)))
			d.retrying(spanEventDatabaseRetry, wait)
			if !p.sleep(wait) {
				return false
			}
		}
	}
}

// applyOne runs one message's transaction: claim the inbox row; if it was
// already there, commit without the handler; otherwise run the handler and
// commit both.
func (p *partition) applyOne(d *delivery) (outcome, error) {
	ctx := p.workCtx
	tx, err := p.w.cfg.DB.Begin(ctx)
	if err != nil {
		return p.dbOutcome(), err
	}
	done := false
	defer func() {
		if !done {
			rollback(tx)
		}
	}()
	claimed, err := p.claimWithCopy(ctx, tx, d)
	if err != nil {
		return p.dbOutcome(), err
	}
	if !claimed {
		done = true
		if err := tx.Commit(ctx); err != nil {
			return p.dbOutcome(), err
		}
		return outcomeDuplicate, nil
	}
	if err := p.lockShared(ctx, tx, []*delivery{d}); err != nil {
		return p.dbOutcome(), err
	}
	if err := p.run(ctx, tx, d); err != nil {
		if ctx.Err() != nil {
			return outcomeStopped, err
		}
		if !errors.Is(err, errHandlerTimeout) && databaseAtFault(tx, err) {
			return outcomeDatabase, err
		}
		return outcomeFailed, err
	}
	if h := p.w.cfg.hooks.beforeDBCommit; h != nil {
		h(d.m)
	}
	done = true // a failed Commit rolls back by itself
	if err := tx.Commit(ctx); err != nil {
		if ctx.Err() != nil {
			return outcomeStopped, err
		}
		// A serializable transaction may learn of its conflict only here.
		if databaseAtFault(tx, err) {
			return outcomeDatabase, err
		}
		// A deferred constraint the effect broke fails at commit: the
		// handler's failure.
		return outcomeFailed, fmt.Errorf("commit: %w", err)
	}
	if h := p.w.cfg.hooks.afterDBCommit; h != nil {
		h(d.m)
	}
	return outcomeApplied, nil
}

// batchResult is what a committed batch transaction did.
type batchResult struct {
	applied    int
	duplicates int
	retry      []*delivery // failed, or behind a failure of their key: settle them next, in order
	inBatch    []bool      // per delivery: finished by the batch transaction
}

// applyBatch applies ds in one transaction with a savepoint per message.
// A failing message is rolled back to its savepoint; it and the later
// messages of its key are settled one by one after the commit, so one
// key's effects keep their order. A batch transaction that breaks
// (connection lost, commit refused) is replayed one message per
// transaction.
func (p *partition) applyBatch(ds []*delivery) bool {
	if p.stopCtx.Err() != nil {
		return false
	}
	slot, ok := p.w.acquire(p.stopCtx.Done())
	if !ok {
		return false
	}
	res, out, err := p.applyBatchTx(ds)
	p.w.release(slot)
	switch out {
	case outcomeApplied:
		p.w.dbAnswered()
		p.metrics.addProcessed(res.applied)
		p.metrics.addDuplicates(res.duplicates)
		for i, d := range ds {
			if res.inBatch[i] {
				p.finish(d.rec)
				d.endSpan(outcomeAppliedName, nil)
			}
		}
		return p.applyEach(res.retry)
	case outcomeStopped:
		return false
	case outcomeDatabase:
		p.metrics.databaseError()
		msg := databaseFailure(err) + " during a batch; applying its messages one by one"
		if pgerr.Is(err, pgerrcode.DeadlockDetected) {
			// Batches whose handlers lock shared rows in message order
			// deadlock each other; the handler should name them.
			msg += " (a handler that locks rows other messages lock too should name them: HandleOpts.Locks)"
		}
		p.log.Warn(msg, slog.String("error", errorText(err)))
	default:
		p.log.Warn("batch transaction failed; applying its messages one by one", slog.String("error", errorText(err)))
	}
	return p.applyEach(ds)
}

func (p *partition) applyBatchTx(ds []*delivery) (batchResult, outcome, error) {
	ctx := p.workCtx
	q := p.w.queries
	consumer := p.g.name
	res := batchResult{inBatch: make([]bool, len(ds))}
	tx, err := p.w.cfg.DB.Begin(ctx)
	if err != nil {
		return res, p.dbOutcome(), err
	}
	done := false
	defer func() {
		if !done {
			rollback(tx)
		}
	}()
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.m.ID
	}
	claimedIDs, err := p.w.claim(ctx, tx, consumer, ids)
	if err != nil {
		return res, p.dbOutcome(), err
	}
	if err := p.recordCopies(ctx, tx, ds); err != nil {
		return res, p.dbOutcome(), err
	}
	claimed := make(map[string]bool, len(claimedIDs)) // new ids not yet given to a handler
	for _, id := range claimedIDs {
		claimed[id] = true
	}
	if p.locks != nil {
		var run []*delivery
		for _, d := range ds {
			if claimed[d.m.ID] {
				run = append(run, d)
			}
		}
		if err := p.lockShared(ctx, tx, run); err != nil {
			return res, p.dbOutcome(), err
		}
	}
	blocked := make(map[string]bool) // keys with a failure in this batch
	released := make(map[string]bool)
	var undo []string // claims to give back: their messages are settled later
	inSavepoint := false
	for i, d := range ds {
		key := string(d.m.Key)
		if blocked[key] || released[d.m.ID] {
			res.retry = append(res.retry, d)
			if claimed[d.m.ID] {
				delete(claimed, d.m.ID)
				released[d.m.ID] = true
				undo = append(undo, d.m.ID)
			}
			continue
		}
		if !claimed[d.m.ID] {
			res.duplicates++
			res.inBatch[i] = true
			continue
		}
		delete(claimed, d.m.ID)
		sp := savepointFirst
		if inSavepoint {
			sp = savepointNext
		}
		if _, err := tx.Exec(ctx, sp); err != nil {
			return res, p.dbOutcome(), err
		}
		inSavepoint = true
		herr := p.run(ctx, tx, d)
		if herr == nil {
			res.applied++
			res.inBatch[i] = true
			continue
		}
		if ctx.Err() != nil {
			return res, outcomeStopped, herr
		}
		// A deadlock or a serialization failure is about the whole
		// transaction (its snapshot, the locks its earlier messages
		// hold), not this message's savepoint: the batch rolls back and
		// its messages are applied one per transaction, none of them
		// charged an attempt.
		if !errors.Is(herr, errHandlerTimeout) && databaseAtFault(tx, herr) {
			return res, outcomeDatabase, herr
		}
		if IsPermanent(herr) {
			d.permanent = herr
		} else {
			d.failures++
			d.lastErr = herr
			p.log.Warn("handler failed in a batch; retrying after the batch", slog.String("id", d.m.ID),
				slog.Int64("offset", d.rec.Offset), slog.Int("attempt", d.m.Attempt), slog.String("error", errorText(herr)))
		}
		if _, err := tx.Exec(ctx, savepointRollback); err != nil {
			return res, outcomeBroken, fmt.Errorf("roll back to the savepoint after %w: %w", herr, err)
		}
		res.retry = append(res.retry, d)
		blocked[key] = true
		released[d.m.ID] = true
		undo = append(undo, d.m.ID)
	}
	if len(undo) > 0 {
		if _, err := q.InboxDeleteMany(ctx, tx, dbsqlc.InboxDeleteManyParams{Consumer: consumer, MessageIds: undo}); err != nil {
			return res, p.dbOutcome(), err
		}
	}
	if h := p.w.cfg.hooks.beforeDBCommit; h != nil {
		h(ds[0].m)
	}
	done = true
	if err := tx.Commit(ctx); err != nil {
		if ctx.Err() != nil {
			return res, outcomeStopped, err
		}
		if databaseAtFault(tx, err) {
			return res, outcomeDatabase, err
		}
		return res, outcomeBroken, fmt.Errorf("commit: %w", err)
	}
	if h := p.w.cfg.hooks.afterDBCommit; h != nil {
		h(ds[0].m)
	}
	return res, outcomeApplied, nil
}

// run is one attempt at d: its handler, unless naming its locks failed.
func (p *partition) run(ctx context.Context, tx pgx.Tx, d *delivery) error {
	if d.locksErr != nil {
		p.span(ctx, d)
		d.m.Attempt++
		d.failed(d.locksErr)
		return d.locksErr
	}
	return p.call(ctx, tx, d)
}

// locksOf returns the shared resources m's handler locks (HandleOpts.Locks),
// turning a panic into an error.
func (p *partition) locksOf(m *Message) (locks []string, err error) {
	if p.locks == nil {
		return nil, nil
	}
	defer func() {
		if v := recover(); v != nil {
			locks, err = nil, fmt.Errorf("HandleOpts.Locks panicked: %v", v)
		}
	}()
	return p.locks(m), nil
}

// lockShared takes the advisory locks of the resources ds's handlers lock,
// in the one order every transaction takes them (InboxLockShared), before
// any of the handlers runs.
func (p *partition) lockShared(ctx context.Context, tx pgx.Tx, ds []*delivery) error {
	var resources []string
	for _, d := range ds {
		resources = append(resources, d.locks...)
	}
	if len(resources) == 0 {
		return nil
	}
	return p.w.queries.InboxLockShared(ctx, tx, dbsqlc.InboxLockSharedParams{LockClass: sharedLockClass, Resources: resources})
}

// call runs the handler with its timeout, turning a panic into an error.
func (p *partition) call(ctx context.Context, tx pgx.Tx, d *delivery) (err error) {
	m := d.m
	if d.drainWork {
		p.w.oldWork.touch(p.g.name) // each attempt: the drain waits for the last one
	}
	hctx, cancel := context.WithTimeout(p.span(ctx, d), p.w.cfg.HandlerTimeout)
	defer cancel()
	m.Attempt++
	start := time.Now()
	defer func() {
		if v := recover(); v != nil {
			err = panicError(v)
		}
		p.metrics.handlerSeconds.Observe(time.Since(start).Seconds())
		if err != nil && ctx.Err() == nil && errors.Is(hctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w after %s: %w", errHandlerTimeout, p.w.cfg.HandlerTimeout, err)
		}
		if err != nil {
			d.failed(err)
		}
	}()
	return p.handler(hctx, tx, m)
}

// dbOutcome classifies a failure of Ferry's own statements: never the
// message's fault.
func (p *partition) dbOutcome() outcome {
	if p.workCtx.Err() != nil {
		return outcomeStopped
	}
	return outcomeDatabase
}

func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx) // a no-op after Commit
}

func permanentReason(err error) DeadLetterReason {
	var pe *PermanentError
	if errors.As(err, &pe) && pe.Reason != "" {
		return pe.Reason
	}
	return ReasonPermanent
}

// claimWithCopy is claimOne of d that also writes its ferry_inbox_copy row
// (a live migration's copy) in tx: in the same statement, one round trip,
// for an authoritative copy in an inbox that is not partitioned.
func (p *partition) claimWithCopy(ctx context.Context, tx pgx.Tx, d *delivery) (bool, error) {
	r := d.copyRow
	if r != nil && r.Role == string(route.Authoritative) && !p.w.partitionedInbox && r.Consumer == d.m.Consumer && r.MessageID == d.m.ID {
		n, err := p.w.queries.InboxCopyClaim(ctx, tx, dbsqlc.InboxCopyClaimParams{Consumer: r.Consumer, MessageID: r.MessageID,
			Plan: r.Plan, Side: r.Side, Epoch: r.Epoch, Digest: r.Digest, ReceivedAt: r.ReceivedAt, Alone: r.Alone})
		return n == 1, err
	}
	claimed, err := p.w.claimOne(ctx, tx, d.m.Consumer, d.m.ID)
	if err != nil || r == nil {
		return claimed, err
	}
	return claimed, p.w.queries.InboxCopyInsert(ctx, tx, *r)
}

// recordCopies writes the ferry_inbox_copy rows of ds (a live migration's
// copies) in tx: the authoritative copies of the partition's consumer in
// one statement, any other one by one.
func (p *partition) recordCopies(ctx context.Context, tx pgx.Tx, ds []*delivery) error {
	q := p.w.queries
	many := dbsqlc.InboxAuthoritativeCopyInsertManyParams{Consumer: p.g.name}
	for _, d := range ds {
		r := d.copyRow
		switch {
		case r == nil:
		case r.Role == string(route.Authoritative) && r.Consumer == p.g.name:
			many.MessageIds, many.Plans, many.Sides = append(many.MessageIds, r.MessageID), append(many.Plans, r.Plan), append(many.Sides, r.Side)
			many.Epochs, many.Digests = append(many.Epochs, r.Epoch), append(many.Digests, r.Digest)
			many.ReceivedAts, many.Alones = append(many.ReceivedAts, r.ReceivedAt), append(many.Alones, r.Alone)
		default:
			if err := q.InboxCopyInsert(ctx, tx, *r); err != nil {
				return err
			}
		}
	}
	if len(many.MessageIds) == 0 {
		return nil
	}
	// Taken for new first (InboxAuthoritativeCopyInsertManyNew) in a
	// savepoint, which the commit releases: a copy recorded already (the
	// batch brought again, a dead letter redriven) rolls back to it and
	// the batch's copies are recorded skipping what is there.
	if _, err := tx.Exec(ctx, savepointCopies); err != nil {
		return err
	}
	err := q.InboxAuthoritativeCopyInsertManyNew(ctx, tx, dbsqlc.InboxAuthoritativeCopyInsertManyNewParams(many))
	if !pgerr.Is(err, pgerrcode.UniqueViolation) {
		return err
	}
	if _, err := tx.Exec(ctx, savepointCopiesRollback); err != nil {
		return err
	}
	return q.InboxAuthoritativeCopyInsertMany(ctx, tx, many)
}
