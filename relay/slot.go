package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/pgerr"
	"github.com/ferryhq/ferry/outbox"
)

// SlotStatus describes the relay's replication slot, as `relay status` shows.
type SlotStatus struct {
	Slot              string
	Exists            bool
	Plugin            string
	Active            bool
	ActivePID         int32  // 0 when no process holds the slot
	ConfirmedFlushLSN string // what PostgreSQL will resend after
	RestartLSN        string
	// WALStatus is reserved, extended, unreserved or lost. A lost slot can
	// no longer deliver the changes it missed.
	WALStatus string
	// RetainedWALBytes is the WAL the slot keeps from being recycled.
	RetainedWALBytes int64
	// Failover is "yes" when the slot is a failover slot (PostgreSQL 17+,
	// kept on standbys that set sync_replication_slots), "no" when it is
	// not, and "" before PostgreSQL 17. Synced tells that this server is a
	// standby holding a synchronized copy.
	Failover string
	Synced   bool
	// Recorded tells that Ferry published from this slot (ferry_relay_slot):
	// if it is missing, `relay run` refuses to start and `relay recover`
	// replaces it. RecordedLSN and RecordedCommitAt are the last confirmed
	// position Ferry wrote down (zero time before the first commit).
	Recorded         bool
	RecordedLSN      string
	RecordedCommitAt time.Time
	// Quarantined counts the events Kafka refused for good.
	Quarantined int64
}

// Status reads the slot's state and the quarantine count. It needs only an
// ordinary connection (a pool, a connection or a transaction), so it works
// while a relay streams.
func Status(ctx context.Context, db outbox.DBTX, slot string) (*SlotStatus, error) {
	if err := checkName("slot", slot); err != nil {
		return nil, err
	}
	q := dbsqlc.New()
	st := &SlotStatus{Slot: slot}
	row, err := q.ReplicationSlotGet(ctx, db, slot)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("read slot %s: %w", slot, err)
	default:
		st.Exists = true
		st.Plugin, st.Active, st.ActivePID = row.Plugin, row.Active, row.ActivePid
		st.ConfirmedFlushLSN, st.RestartLSN = row.ConfirmedFlushLsn, row.RestartLsn
		st.WALStatus, st.RetainedWALBytes = row.WalStatus, row.RetainedWalBytes
		if st.Failover, st.Synced, err = slotFailover(ctx, db, slot); err != nil {
			return nil, err
		}
	}
	rec, err := readSlotRecord(ctx, db, slot)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		st.Recorded, st.RecordedLSN = true, rec.ConfirmedLsn
		if rec.ConfirmedCommitAt != nil {
			st.RecordedCommitAt = *rec.ConfirmedCommitAt
		}
	}
	if st.Quarantined, err = q.OutboxQuarantineCount(ctx, db); err != nil {
		return nil, fmt.Errorf("count quarantined events: %w", err)
	}
	return st, nil
}

// slotLostError explains what a lost slot means and what to do.
func slotLostError(slot string) error {
	return fmt.Errorf("%w: slot %q has wal_status = lost: PostgreSQL removed WAL the relay had not confirmed, "+
		"so outbox events written meanwhile may be missing from Kafka. Ferry does not recreate the slot by itself. "+
		"Raise max_slot_wal_keep_size, then run `relay recover`: it replaces the slot and republishes the outbox rows "+
		"committed since the relay last confirmed", ErrSlotLost, slot)
}

// prepare checks the server and makes sure the publication and slot exist,
// creating them unless noCreate.
func prepare(ctx context.Context, db dbsqlc.DBTX, slot, publication string, noCreate bool, log *slog.Logger) error {
	if err := checkServer(ctx, db); err != nil {
		return err
	}
	if err := ensurePublication(ctx, db, publication, noCreate, log); err != nil {
		return err
	}
	return ensureSlot(ctx, db, slot, noCreate, log)
}

// checkServer checks wal_level and the outbox table.
func checkServer(ctx context.Context, db dbsqlc.DBTX) error {
	q := dbsqlc.New()
	walLevel, err := q.SettingGet(ctx, db, "wal_level")
	if err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		return fmt.Errorf("%w: it is %q; set wal_level = logical in postgresql.conf and restart PostgreSQL", ErrWALLevel, walLevel)
	}
	outboxExists, err := q.OutboxExists(ctx, db)
	if err != nil {
		return fmt.Errorf("look up outbox table: %w", err)
	}
	if !outboxExists {
		return fmt.Errorf("%w: run `relay schema` first", ErrOutboxMissing)
	}
	return nil
}

func ensurePublication(ctx context.Context, db dbsqlc.DBTX, pub string, noCreate bool, log *slog.Logger) error {
	// DDL takes no parameters, so sqlc cannot own this statement: the name
	// goes in as a quoted identifier (and checkName kept it to [a-z0-9_]).
	name := pgx.Identifier{pub}.Sanitize()
	// publish_via_partition_root: a partitioned outbox's rows reach the
	// relay as the outbox's, not as its partitions'; a plain one is
	// unaffected.
	create := fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE outbox, ferry_migration_step WITH (publish = 'insert', publish_via_partition_root = true)`, name)
	viaRoot := fmt.Sprintf(`ALTER PUBLICATION %s SET (publish_via_partition_root = true)`, name)
	// The relay reads a live migration's steps in the same stream as the
	// outbox rows (route.go).
	addSteps := fmt.Sprintf(`ALTER PUBLICATION %s ADD TABLE ferry_migration_step`, name)
	p, err := dbsqlc.New().PublicationGet(ctx, db, pub)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if noCreate {
			return fmt.Errorf("%w: publication %q does not exist and NoCreate is set; an administrator can create it with: %s", ErrPublicationMissing, pub, create)
		}
		if _, err := db.Exec(ctx, create); err != nil && !pgerr.DuplicateObject(err) { // another relay won
			return fmt.Errorf("create publication %q: %w", pub, err)
		}
		log.Info("created publication", slog.String("publication", pub))
		return nil
	case err != nil:
		return fmt.Errorf("read publication %q: %w", pub, err)
	case !p.CoversOutbox:
		return fmt.Errorf("%w: publication %q exists but does not include the outbox table: ALTER PUBLICATION %s ADD TABLE outbox", ErrPublicationMissing, pub, pgx.Identifier{pub}.Sanitize())
	case !p.Pubinsert:
		return fmt.Errorf("%w: publication %q does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", ErrPublicationMissing, pub, pgx.Identifier{pub}.Sanitize())
	case p.OutboxPartitioned && !p.Pubviaroot && noCreate:
		return fmt.Errorf("%w: the outbox table is partitioned but publication %q publishes its rows as its partitions', "+
			"which the relay does not read, and NoCreate is set; an administrator can fix it with: %s", ErrPublicationMissing, pub, viaRoot)
	case p.OutboxPartitioned && !p.Pubviaroot:
		if _, err := db.Exec(ctx, viaRoot); err != nil {
			return fmt.Errorf("publish the partitioned outbox's rows as the outbox's (%s): %w", viaRoot, err)
		}
		log.Info("publication publishes the partitioned outbox's rows as the outbox's", slog.String("publication", pub))
		return ensurePublication(ctx, db, pub, noCreate, log)
	case !p.CoversSteps && noCreate:
		return fmt.Errorf("%w: publication %q does not include ferry_migration_step (live migrations) and NoCreate is set; "+
			"an administrator can add it with: %s", ErrPublicationMissing, pub, addSteps)
	case !p.CoversSteps:
		if _, err := db.Exec(ctx, addSteps); err != nil && !pgerr.DuplicateObject(err) {
			return fmt.Errorf("add ferry_migration_step to publication %q (%s): %w", pub, addSteps, err)
		}
		log.Info("added ferry_migration_step to the publication", slog.String("publication", pub))
	}
	return nil
}

// ensureSlot makes sure the slot exists, creating it unless noCreate. A slot
// Ferry published from (recorded in ferry_relay_slot) that is gone, lost or
// on another server is never created again: that would skip what happened
// in between (ErrSlotGone, ErrSlotLost).
func ensureSlot(ctx context.Context, db dbsqlc.DBTX, slot string, noCreate bool, log *slog.Logger) error {
	q := dbsqlc.New()
	rec, err := readSlotRecord(ctx, db, slot)
	if err != nil {
		return err
	}
	sysid, err := q.SystemIdentifier(ctx, db)
	if err != nil {
		return fmt.Errorf("read the server's system identifier: %w", err)
	}
	st, err := q.ReplicationSlotGet(ctx, db, slot)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if rec != nil {
			return slotGoneError(slot, rec, sysid, false)
		}
		failover, err := slotFailoverSupported(ctx, db)
		if err != nil {
			return err
		}
		if noCreate {
			create := fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", slot)
			if failover {
				create = fmt.Sprintf("SELECT pg_create_logical_replication_slot('%s', 'pgoutput', failover => true)", slot)
			}
			return fmt.Errorf("%w: slot %q does not exist and NoCreate is set; an administrator can create it with: %s", ErrSlotMissing, slot, create)
		}
		return createRecordedSlot(ctx, db, slot, failover, log)
	case err != nil:
		return fmt.Errorf("read replication slot %q: %w", slot, err)
	case st.Plugin != "pgoutput":
		return fmt.Errorf("%w: slot %q uses plugin %q, not pgoutput; choose another slot name", ErrFatal, slot, st.Plugin)
	case !st.SameDatabase:
		return fmt.Errorf("%w: slot %q belongs to another database; choose another slot name", ErrFatal, slot)
	case st.WalStatus == "lost":
		return slotLostError(slot)
	case rec != nil && rec.RecoveringSince != nil:
		return fmt.Errorf("%w: a recovery of slot %q (republishing the outbox since %s) did not finish: run `relay recover` again",
			ErrSlotGone, slot, rec.RecoveringSince.UTC().Format(time.RFC3339Nano))
	case rec != nil && rec.SystemIdentifier != sysid:
		return slotGoneError(slot, rec, sysid, true)
	}
	failover, _, err := slotFailover(ctx, db, slot)
	if err != nil {
		return err
	}
	if failover == "no" {
		log.Warn("the replication slot is not a failover slot: a promoted standby will not have it and the relay will need `relay recover`. "+
			"Make it one on a replication connection: psql \"dbname=DB replication=database\" -c 'ALTER_REPLICATION_SLOT "+slot+" (FAILOVER true)' "+
			"while no relay streams from it", slog.String("slot", slot))
	}
	if rec == nil {
		// Created by an administrator (or by a relay that stopped before
		// recording it): Ferry knows it from now on.
		log.Info("recording replication slot", slog.String("slot", slot), slog.String("confirmed_flush_lsn", st.ConfirmedFlushLsn))
		return recordSlot(ctx, db, slot, st.ConfirmedFlushLsn, pgtype.Int8{}, false)
	}
	return nil
}

// createRecordedSlot creates the slot and records it with the newest
// migration step as the one in effect from its start. It holds the lock
// every migration request takes, so no step commits while the slot is
// created: each step is either before the slot's start (and recorded) or
// after it (and in its stream).
func createRecordedSlot(ctx context.Context, db dbsqlc.DBTX, slot string, failover bool, log *slog.Logger) error {
	b, ok := db.(interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	})
	if !ok {
		return fmt.Errorf("create replication slot %q: a pool or a connection is needed, not a transaction", slot)
	}
	var lsn string
	err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		q := dbsqlc.New()
		if err := q.MigrationSerialize(ctx, tx); err != nil { // no write: PostgreSQL creates the slot in this transaction
			return err
		}
		var err error
		if lsn, err = createSlot(ctx, tx, slot, failover); err != nil {
			return err
		}
		seq, err := q.MigrationStepNewest(ctx, tx)
		if err != nil {
			return err
		}
		return recordSlot(ctx, tx, slot, lsn, pgtype.Int8{Int64: seq, Valid: true}, true)
	})
	if pgerr.DuplicateObject(err) {
		return nil // another relay created it, and records it
	}
	if err != nil {
		return fmt.Errorf("create replication slot %q: %w", slot, err)
	}
	log.Info("created replication slot", slog.String("slot", slot), slog.String("lsn", lsn))
	return nil
}

// slotFailover reads the slot's failover and synced flags: "yes" or "no",
// and "" (with synced false) before PostgreSQL 17, which has neither.
// sqlc's catalog does not know these columns, so sqlc cannot own this
// query.
func slotFailover(ctx context.Context, db dbsqlc.DBTX, slot string) (failover string, synced bool, err error) {
	supported, err := slotFailoverSupported(ctx, db)
	if err != nil || !supported {
		return "", false, err
	}
	var on bool
	err = db.QueryRow(ctx, `SELECT failover, synced FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&on, &synced)
	if err != nil {
		return "", false, fmt.Errorf("read the failover flag of slot %q: %w", slot, err)
	}
	if on {
		return "yes", synced, nil
	}
	return "no", synced, nil
}

// failoverMinVersion is the first PostgreSQL (server_version_num) whose
// logical slots can fail over: a standby with sync_replication_slots = on
// keeps a copy of a failover slot, and after a promotion the relay streams on
// from it.
const failoverMinVersion = 170000

// slotFailoverSupported tells whether the server can create failover slots.
func slotFailoverSupported(ctx context.Context, db dbsqlc.DBTX) (bool, error) {
	v, err := dbsqlc.New().SettingGet(ctx, db, "server_version_num")
	if err != nil {
		return false, fmt.Errorf("read server_version_num: %w", err)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return false, fmt.Errorf("read server_version_num %q: %w", v, err)
	}
	return n >= failoverMinVersion, nil
}

// createSlot creates the logical slot and returns where it starts; with
// failover (PostgreSQL 17 and later) the slot can be synchronized to
// standbys. Fails with duplicate_object when another process created it.
func createSlot(ctx context.Context, db dbsqlc.DBTX, slot string, failover bool) (string, error) {
	if !failover {
		return dbsqlc.New().ReplicationSlotCreate(ctx, db, slot)
	}
	// sqlc's catalog knows pg_create_logical_replication_slot only without
	// the failover argument PostgreSQL 17 added, so sqlc cannot own this
	// call.
	var lsn string
	err := db.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`, slot).Scan(&lsn)
	return lsn, err
}

// readSlot returns the slot's state. Its confirmed_flush_lsn is where
// PostgreSQL would resume the slot now; a process that holds the slot can
// move it before the next START_REPLICATION (startPosition).
func readSlot(ctx context.Context, db dbsqlc.DBTX, slot string) (*dbsqlc.ReplicationSlotGetRow, error) {
	st, err := dbsqlc.New().ReplicationSlotGet(ctx, db, slot)
	if err != nil {
		return nil, fmt.Errorf("read confirmed_flush_lsn of slot %q: %w", slot, err)
	}
	if st.ConfirmedFlushLsn == "" {
		return nil, fmt.Errorf("slot %q has no confirmed_flush_lsn", slot)
	}
	return st, nil
}

// Setup creates the publication and the slot when they are missing. The
// slot keeps every transaction that commits after it exists, so creating it
// before the application writes its first event (as `relay schema` does)
// means no event is ever missed, even before the relay first runs.
//
// Setup needs no Kafka settings: only db, on which it checks wal_level and
// the outbox table and creates what is missing, and the two names. Pass a
// pool or a connection, not a transaction: PostgreSQL creates no slot in a
// transaction that has written (the publication). An empty slot or
// publication means SlotDefault or PublicationDefault; a nil logger
// discards.
func Setup(ctx context.Context, db outbox.DBTX, slot, publication string, logger *slog.Logger) error {
	slot, publication = cmp.Or(slot, SlotDefault), cmp.Or(publication, PublicationDefault)
	if err := checkName("slot", slot); err != nil {
		return err
	}
	if err := checkName("publication", publication); err != nil {
		return err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return prepare(ctx, db, slot, publication, false, logger)
}

// startPosition returns where the stream of a session that holds slot (its
// walsender is process pid) starts: the slot's confirmed_flush_lsn, read
// after START_REPLICATION and before the session's first status update.
// The server started the stream at that position, and only the status
// updates of the walsender that holds the slot move it. Read before
// START_REPLICATION it can be out of date: the last status update of a
// relay letting the slot go (a standby's predecessor, the old process of
// a rolling restart) can move it past a migration step in between, and a
// session that took the older position put the step before it in effect.
func startPosition(ctx context.Context, db dbsqlc.DBTX, slot string, pid uint32) (pglogrepl.LSN, error) {
	st, err := readSlot(ctx, db, slot)
	if err != nil {
		return 0, err
	}
	if !st.Active || uint32(st.ActivePid) != pid {
		// The session's walsender is gone (a standby may hold the slot by
		// now), or the connection goes through a proxy that gives process
		// ids of its own: either way the position read is not the start.
		return 0, fmt.Errorf("read where the stream of slot %q starts: the slot is held by process %d, not by this session's walsender, process %d",
			slot, st.ActivePid, pid)
	}
	start, err := pglogrepl.ParseLSN(st.ConfirmedFlushLsn)
	if err != nil {
		return 0, fmt.Errorf("parse confirmed_flush_lsn %q of slot %q: %w", st.ConfirmedFlushLsn, slot, err)
	}
	return start, nil
}
