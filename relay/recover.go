package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/pgerr"
)

// RecoverMarginDefault is how long before the last confirmed commit time a
// recovery starts republishing: a transaction that began before it and
// committed after the last confirmed one is still republished.
const RecoverMarginDefault = time.Hour

// Recovery refusals. Match them with errors.Is.
var (
	// ErrNothingToRecover means the slot exists, is healthy and is the one
	// Ferry published from: `relay run` streams from it.
	ErrNothingToRecover = errors.New("relay: nothing to recover")
	// ErrGapNotRetained means the outbox holds no row older than the start
	// of the window to republish (or, for a window that reaches back
	// before Ferry first created the slot, none older than the newest
	// commit the slot confirmed), so retention (or someone) may have
	// deleted rows from it; RecoverOpts.Force republishes what is left.
	ErrGapNotRetained = errors.New("relay: the outbox may no longer hold every event of the gap")
)

// RecoverOpts tunes Recover. nil means the defaults.
type RecoverOpts struct {
	// Margin is how long before the last confirmed commit time to start
	// republishing. Defaults to RecoverMarginDefault (1h).
	Margin time.Duration
	// Since, when set, is where to start republishing (outbox rows created
	// at or after it), instead of the record's commit time less Margin. It
	// is required when Ferry has no record of the slot.
	Since time.Time
	// Force republishes even when part of the window may have been
	// deleted (ErrGapNotRetained).
	Force bool
}

// RecoverResult says what Recover did.
type RecoverResult struct {
	Since       time.Time // outbox rows created at or after it were republished
	Republished int       // records Kafka acknowledged
	Quarantined int       // rows Kafka refused for good, now in outbox_quarantine
	SlotLSN     string    // where the new slot starts streaming
	Replaced    string    // what happened to the old slot: "missing", "dropped (lost)", ...
}

// Recover replaces a slot that is gone, lost or on another server
// (ErrSlotGone, ErrSlotLost) without losing an event:
//
//  1. it marks the recovery in ferry_relay_slot, so no relay streams from
//     the new slot before the gap is republished, even if Recover dies;
//  2. it creates the new slot first, with the snapshot of its starting
//     point, trying again while the server refuses for now (a
//     serialization failure such as "initial slot snapshot too large", a
//     server restarting);
//  3. in that snapshot (exactly the transactions the new slot will not
//     send) it republishes every outbox row created since the last
//     confirmed commit time less the margin, in id order, before anything
//     the new slot streams, in commit order (see windowInCommitOrder);
//     Kafka's refusals go to quarantine as usual;
//  4. once Kafka acknowledged all of them, it records the new slot, and
//     `relay run` streams on from it.
//
// Events published before the slot went away are published again; the
// consumers' inboxes absorb them. Recover refuses a healthy slot
// (ErrNothingToRecover), a slot another process streams from, and a window
// the outbox may no longer hold in full (ErrGapNotRetained, unless Force).
func (r *Relay) Recover(ctx context.Context, opts *RecoverOpts) (*RecoverResult, error) {
	var o RecoverOpts
	if opts != nil {
		o = *opts
	}
	if o.Margin == 0 {
		o.Margin = RecoverMarginDefault
	}
	if o.Margin < 0 {
		return nil, fmt.Errorf("relay: RecoverOpts.Margin is %s: must not be negative", o.Margin)
	}
	log := r.cfg.Logger.With(slog.String("slot", r.cfg.Slot))
	pool, err := r.connect(ctx, log)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	q := dbsqlc.New()
	if err := checkServer(ctx, pool); err != nil {
		return nil, err
	}
	if err := ensurePublication(ctx, pool, r.cfg.Publication, r.cfg.NoCreate, log); err != nil {
		return nil, err
	}

	if busy, err := q.MigrationActiveOther(ctx, pool, ""); err != nil {
		return nil, fmt.Errorf("relay: recover: read the migration plans: %w", err)
	} else if len(busy) > 0 {
		return nil, fmt.Errorf("%w: migration plan %q is in %s, and a recovery republishes to the relay's own channel only, "+
			"without the migration's copies and stamps: abandon or roll the plan back to OLD_ONLY first "+
			"(relay migration request %s OLD_ONLY from DUAL_WRITE), recover, then start the migration again",
			ErrFatal, busy[0].Migration, busy[0].Phase, busy[0].Migration)
	}

	res := &RecoverResult{}
	rec, err := readSlotRecord(ctx, pool, r.cfg.Slot)
	if err != nil {
		return nil, err
	}
	if res.Replaced, err = r.clearSlot(ctx, pool, rec, log); err != nil {
		return nil, err
	}
	switch {
	case !o.Since.IsZero():
		res.Since = o.Since
	case rec == nil:
		return nil, fmt.Errorf("relay: Ferry has no record of slot %q, so it does not know since when to republish: give RecoverOpts.Since (relay recover --since)", r.cfg.Slot)
	case rec.RecoveringSince != nil:
		res.Since = *rec.RecoveringSince // a recovery that did not finish: the same window again
	case rec.ConfirmedCommitAt != nil:
		res.Since = rec.ConfirmedCommitAt.Add(-o.Margin)
	default:
		res.Since = rec.CreatedAt.Add(-o.Margin)
	}
	if !o.Force {
		if err := windowRetained(ctx, pool, rec, res.Since); err != nil {
			return nil, err
		}
	}
	if err := q.RelaySlotRecovering(ctx, pool, dbsqlc.RelaySlotRecoveringParams{SlotName: r.cfg.Slot, Since: res.Since}); err != nil {
		return nil, fmt.Errorf("relay: recover: mark the recovery in ferry_relay_slot: %w", err)
	}

	sink, closeSink, err := r.newSink(log)
	if err != nil {
		return nil, err
	}
	defer closeSink()

	// The new slot first: from its starting point on it keeps every
	// transaction; the snapshot it exports sees exactly those before.
	conn, created, err := r.createRecoverySlot(ctx, log)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	res.SlotLSN = created.ConsistentPoint
	log.Info("recovery: created the new slot; republishing the outbox from its snapshot",
		slog.String("lsn", created.ConsistentPoint), slog.Time("since", res.Since))

	var routeSeq int64
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// Transaction control, not a query: sqlc has no place for it.
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+created.SnapshotName+"'"); err != nil {
			return fmt.Errorf("import the slot's snapshot: %w", err)
		}
		// The migration steps before the slot's start are in effect from
		// it; the later ones are in its stream (route.go).
		if routeSeq, err = q.MigrationStepNewest(ctx, tx); err != nil {
			return fmt.Errorf("read the migration steps: %w", err)
		}
		return r.republish(ctx, tx, pool, sink, res, log)
	})
	if err != nil {
		return res, fmt.Errorf("relay: recover: %w (the recovery is marked unfinished: run it again)", err)
	}
	if err := recordSlot(ctx, pool, r.cfg.Slot, created.ConsistentPoint, pgtype.Int8{Int64: routeSeq, Valid: true}, true); err != nil {
		return res, fmt.Errorf("relay: recover: %w (run it again)", err)
	}
	log.Info("recovery finished: `relay run` streams on from the new slot",
		slog.Int("republished", res.Republished), slog.Int("quarantined", res.Quarantined))
	return res, nil
}

// windowRetained refuses, with ErrGapNotRetained, a window from since that
// the outbox may no longer hold in full. Rows go oldest first (retention),
// so a row older than the window's start shows that none of the window
// went. A window that reaches back before Ferry first created the slot
// (rec.FirstCreatedAt; a database younger than the margin, a new service)
// can have no row older than its start, and needs none: no slot of that
// name streamed a transaction committed before then, so nothing from
// before can be missing. There a row older than the newest commit the slot
// confirmed shows that the outbox was not cut past what Kafka has; with
// nothing confirmed yet, nothing was published.
func windowRetained(ctx context.Context, db dbsqlc.DBTX, rec *slotRecord, since time.Time) error {
	q := dbsqlc.New()
	older, err := q.OutboxCreatedBefore(ctx, db, since)
	if err != nil {
		return fmt.Errorf("relay: recover: %w", err)
	}
	if older {
		return nil
	}
	if rec == nil || rec.FirstCreatedAt == nil || !since.Before(*rec.FirstCreatedAt) {
		return fmt.Errorf("%w: no outbox row is older than %s, the start of the window to republish, so rows of the window "+
			"may have been deleted (retention, or by hand) and their events would be missing from Kafka. Check "+
			"(SELECT min(created_at) FROM outbox), then run again with --force (RecoverOpts.Force) to republish what is left",
			ErrGapNotRetained, since.UTC().Format(time.RFC3339Nano))
	}
	if rec.ConfirmedCommitAt == nil {
		return nil
	}
	if older, err = q.OutboxCreatedBefore(ctx, db, *rec.ConfirmedCommitAt); err != nil {
		return fmt.Errorf("relay: recover: %w", err)
	}
	if older {
		return nil
	}
	return fmt.Errorf("%w: the window to republish starts at %s, before Ferry first created slot %q (%s), but no outbox row is "+
		"older than %s, the newest commit the slot confirmed, so rows of the window may have been deleted (by hand?) and their "+
		"events would be missing from Kafka. Check (SELECT min(created_at) FROM outbox), then run again with --force "+
		"(RecoverOpts.Force) to republish what is left", ErrGapNotRetained, since.UTC().Format(time.RFC3339Nano), rec.SlotName,
		rec.FirstCreatedAt.UTC().Format(time.RFC3339Nano), rec.ConfirmedCommitAt.UTC().Format(time.RFC3339Nano))
}

// clearSlot makes room for the new slot: it drops a lost slot, a slot on
// another server than the recorded one, or the slot of an unfinished
// recovery, and refuses to touch a healthy or active one.
func (r *Relay) clearSlot(ctx context.Context, pool *pgxpool.Pool, rec *slotRecord, log *slog.Logger) (string, error) {
	q := dbsqlc.New()
	st, err := q.ReplicationSlotGet(ctx, pool, r.cfg.Slot)
	if errors.Is(err, pgx.ErrNoRows) {
		return "missing", nil
	}
	if err != nil {
		return "", fmt.Errorf("relay: recover: read slot %q: %w", r.cfg.Slot, err)
	}
	sysid, err := q.SystemIdentifier(ctx, pool)
	if err != nil {
		return "", fmt.Errorf("relay: recover: read the server's system identifier: %w", err)
	}
	var why string
	switch {
	case st.WalStatus == "lost":
		why = "lost"
	case rec != nil && rec.SystemIdentifier != sysid:
		why = "on another server"
	case rec != nil && rec.RecoveringSince != nil:
		why = "of an unfinished recovery"
	default:
		return "", fmt.Errorf("%w: slot %q exists and is healthy; `relay run` streams from it", ErrNothingToRecover, r.cfg.Slot)
	}
	if st.Active {
		return "", fmt.Errorf("relay: recover: slot %q (%s) is in use by process %d: stop that relay first", r.cfg.Slot, why, st.ActivePid)
	}
	if err := q.ReplicationSlotDrop(ctx, pool, r.cfg.Slot); err != nil {
		return "", fmt.Errorf("relay: recover: drop slot %q (%s): %w", r.cfg.Slot, why, err)
	}
	log.Warn("recovery: dropped the old slot", slog.String("reason", why))
	return "dropped (" + why + ")", nil
}

// recoverPage is how many outbox rows one query of a recovery reads.
const recoverPage = 1000

// windowInCommitOrder returns the ids of the outbox rows created since
// since, in commit order: exact when track_commit_timestamp is on, else in
// the order their transactions got their ids, which is commit order for an
// aggregate whose writers lock it before anything else (a transaction that
// locked another aggregate first may have its id before the one it waited
// for: the fault suite saw 3 inversions that way). created_at cannot tell:
// it is when a transaction began, and one that waited for a lock commits
// after one that began later.
func windowInCommitOrder(ctx context.Context, tx pgx.Tx, since time.Time, log *slog.Logger) ([]uuid.UUID, error) {
	q := dbsqlc.New()
	track, err := q.SettingGet(ctx, tx, "track_commit_timestamp")
	if err != nil {
		return nil, fmt.Errorf("read track_commit_timestamp: %w", err)
	}
	if track != "on" {
		log.Warn("recovery: track_commit_timestamp is off, so the gap is republished in transaction-id order, which is " +
			"commit order only for an aggregate whose writers lock it first and lock nothing before it; a consumer that " +
			"compares versions is safe either way. Turn it on (a restart) for exact order in the next recovery")
	}
	var ids []uuid.UUID
	if track == "on" {
		ids, err = q.OutboxWindowByCommitTime(ctx, tx, since)
	} else {
		ids, err = q.OutboxWindowByXid(ctx, tx, since)
	}
	if err != nil {
		return nil, fmt.Errorf("read the outbox window: %w", err)
	}
	return ids, nil
}

// republish publishes every outbox row created since res.Since that tx
// sees, and waits until Kafka acknowledged (or refused for good) each one.
func (r *Relay) republish(ctx context.Context, tx pgx.Tx, pool *pgxpool.Pool, sink Sink, res *RecoverResult, log *slog.Logger) error {
	q := dbsqlc.New()
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		failed   error
		refused  []refusal
		inFlight = make(chan struct{}, r.cfg.MaxInFlightRecords)
	)
	promise := func(rec *kgo.Record, err error) {
		p := rec.Context.(*inflight)
		p.endSpan(err)
		mu.Lock()
		switch reason, permanent := permanentReason(err); {
		case err == nil:
			res.Republished++
		case permanent:
			refused = append(refused, refusal{p, reason, err})
		case failed == nil:
			failed = err
		}
		mu.Unlock()
		<-inFlight
		wg.Done()
	}
	ids, err := windowInCommitOrder(ctx, tx, res.Since, log)
	if err != nil {
		return err
	}
	for start := 0; start < len(ids); start += recoverPage {
		batch := ids[start:min(start+recoverPage, len(ids))]
		rows, err := q.OutboxGetByIDs(ctx, tx, batch)
		if err != nil {
			return fmt.Errorf("read the outbox: %w", err)
		}
		byID := make(map[uuid.UUID]*dbsqlc.Outbox, len(rows))
		for _, o := range rows {
			byID[o.ID] = o
		}
		for _, id := range batch {
			o := byID[id]
			p := &inflight{Context: ctx, event: event{row: row{
				ID: o.ID, AggregateType: []byte(o.AggregateType), AggregateID: []byte(o.AggregateID),
				EventType: []byte(o.EventType), Payload: o.Payload, CreatedAt: o.CreatedAt,
			}}}
			if p.row.Headers, err = parseHeaders(o.Headers); err != nil {
				return fmt.Errorf("outbox row %s: headers: %w", o.ID, err)
			}
			topic := r.namer.topic(&p.row)
			p.fill(topic.name, r.cfg.CloudEvents)
			if topic.problem != "" {
				mu.Lock()
				refused = append(refused, refusal{p, ReasonInvalidTopic, errors.New(topic.problem)})
				mu.Unlock()
				continue
			}
			if name, ok := p.reservedHeader(r.cfg.CloudEvents); ok {
				mu.Lock()
				refused = append(refused, refusal{p, ReasonReservedHeader, fmt.Errorf("the row's headers use %q, a name Ferry reserves", name)})
				mu.Unlock()
				continue
			}
			select {
			case inFlight <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return ctx.Err()
			}
			r.tracing.start(p)
			wg.Add(1)
			sink.Produce(ctx, &p.rec, promise)
		}
	}
	wg.Wait()
	if failed != nil {
		return fmt.Errorf("%s: %w", r.brokerLower(), failed)
	}
	for _, f := range refused {
		reason := f.reason
		if _, err := q.OutboxQuarantineInsert(ctx, pool, quarantineParams(f.p, reason, f.err)); err != nil {
			return fmt.Errorf("quarantine outbox row %s: %w", f.p.row.ID, err)
		}
		log.Warn("recovery: event quarantined: "+r.broker()+" refuses it for good", slog.String("id", f.p.row.ID.String()),
			slog.String("topic", f.p.rec.Topic), slog.String("reason", string(reason)), slog.String("error", f.err.Error()))
		res.Quarantined++
	}
	return nil
}

// refusal is a row the broker will never accept, on its way to quarantine.
type refusal struct {
	p      *inflight
	reason QuarantineReason
	err    error
}

// slotAttempts bounds the tries at creating a recovery's slot while the
// server refuses it for now (createRecoverySlot): about 20 s of backoff.
const slotAttempts = 8

// createRecoverySlot creates the recovery's slot and returns the snapshot
// of its starting point with the replication connection that holds it (the
// snapshot lives while the connection stays open and runs nothing else). A
// refusal the server may not repeat is tried again, with backoff, on a new
// connection, up to slotAttempts times: a serialization failure or a
// deadlock (PostgreSQL refuses to export a snapshot while too many
// transactions run beside it: "initial slot snapshot too large", 40001),
// or the server unreachable for a moment (restarting, the connection
// lost). Any other refusal fails at once.
func (r *Relay) createRecoverySlot(ctx context.Context, log *slog.Logger) (*pgconn.PgConn, pglogrepl.CreateReplicationSlotResult, error) {
	retry := backoff.Sequence{Base: 250 * time.Millisecond, Ceiling: 5 * time.Second}
	for attempt := 1; ; attempt++ {
		conn, err := r.replicationConn(ctx)
		if errors.Is(err, ErrFatal) {
			return nil, pglogrepl.CreateReplicationSlotResult{}, err
		}
		if err == nil {
			var created pglogrepl.CreateReplicationSlotResult
			if created, err = r.createSlot(ctx, conn, attempt); err == nil {
				return conn, created, nil
			}
			conn.Close(context.Background())
		}
		switch {
		case !pgerr.Transient(err) && !pgerr.Unreachable(err):
			return nil, pglogrepl.CreateReplicationSlotResult{}, fmt.Errorf("relay: recover: create slot %q: %w "+
				"(the recovery is marked unfinished: run it again once that is fixed)", r.cfg.Slot, err)
		case attempt == slotAttempts:
			return nil, pglogrepl.CreateReplicationSlotResult{}, fmt.Errorf("relay: recover: create slot %q: the server refused "+
				"for now, and still after %d attempts: %w (the recovery is marked unfinished: run it again, when fewer "+
				"transactions run if the snapshot was too large)", r.cfg.Slot, attempt, err)
		}
		wait := retry.Next()
		log.Warn("recovery: the server refused to create the slot for now; trying again", slog.Int("attempt", attempt),
			slog.String("error", err.Error()), slog.Duration("retry_in", wait))
		if !sleep(ctx, wait) {
			return nil, pglogrepl.CreateReplicationSlotResult{}, fmt.Errorf("relay: recover: create slot %q: %w", r.cfg.Slot, ctx.Err())
		}
	}
}

// createSlot makes the attempt-th try at creating the recovery's slot on
// conn, or runs the fault a test put in its place (Config.slotFault).
func (r *Relay) createSlot(ctx context.Context, conn *pgconn.PgConn, attempt int) (pglogrepl.CreateReplicationSlotResult, error) {
	if r.cfg.slotFault != nil {
		if stmt := r.cfg.slotFault(attempt); stmt != "" {
			_, err := conn.Exec(ctx, stmt).ReadAll()
			if err == nil {
				err = fmt.Errorf("the fault %q did not fail", stmt)
			}
			return pglogrepl.CreateReplicationSlotResult{}, err
		}
	}
	return createSlotExportingSnapshot(ctx, conn, r.cfg.Slot)
}

// createSlotExportingSnapshot creates the slot on a replication connection
// and exports the snapshot of its starting point. On PostgreSQL 17 and later
// the slot is a failover slot, as ensureSlot creates it: pglogrepl speaks
// only the old syntax, which has no FAILOVER option, so the command is
// written here in the new one (the slot name passed checkName).
func createSlotExportingSnapshot(ctx context.Context, conn *pgconn.PgConn, slot string) (pglogrepl.CreateReplicationSlotResult, error) {
	if serverMajor(conn.ParameterStatus("server_version"))*10000 < failoverMinVersion {
		return pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{SnapshotAction: "EXPORT_SNAPSHOT"})
	}
	return pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx,
		fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)", slot)))
}

// serverMajor reads the major version from server_version ("17.2",
// "15.18 (Debian 15.18-0+deb12u1)"); 0 when it cannot.
func serverMajor(version string) int {
	end := strings.IndexFunc(version, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(version)
	}
	n, _ := strconv.Atoi(version[:end])
	return n
}
