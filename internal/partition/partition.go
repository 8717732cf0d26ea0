// Package partition lays Ferry's outbox and inbox out as tables partitioned by day,
// so that retention drops whole partitions instead of deleting rows (whose
// WAL, vacuum work and bloat grow with the rows), and does the DDL of its
// upkeep: partitions created ahead, expired ones fenced and dropped. Which
// partitions may go is the caller's rule (the relay's: only what its slot
// confirmed); this package only names, creates, fences and drops them.
//
// Layout of a table T partitioned on column K: RANGE (K), one partition
// per UTC day named T_pYYYYMMDD, and T_default, which takes a row no
// other partition does (a K set by hand far in the past or the future)
// so that no application transaction fails for want of a partition.
// Retention never drops the default partition.
package partition

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/dbsqlc"
	"github.com/ferryhq/ferry/internal/pgerr"
)

// Ahead is how many days after today have a partition: retention creates
// the missing ones every round, so a stopped relay or worker leaves a week
// before new rows go to the default partition.
const Ahead = 7

// lockTimeout bounds every wait of the upkeep's DDL for a lock: creating
// or dropping a partition locks the whole table for an instant, and a
// statement waiting behind a long reader would hold every writer queued
// behind it. It gives up and the next round tries again.
const lockTimeout = "5s"

// ErrNotEmpty is returned, wrapped, by Convert for a table that holds rows:
// Ferry does not move rows into a new layout.
var ErrNotEmpty = errors.New("the table is not empty")

// Table is a table Ferry may partition by day.
type Table struct {
	Name string   // outbox
	Key  string   // the partition key: created_at
	PK   []string // the primary key's columns before Key: id
}

// Outbox is Ferry's outbox, partitioned on created_at. Its primary key
// becomes (id, created_at): PostgreSQL has no index across partitions, so
// an id is unique within a day's partition only. The writer's ids are
// UUIDv7 and never repeat; an Event.ID chosen by hand and used again on
// another day is not refused.
var Outbox = Table{Name: "outbox", Key: "created_at", PK: []string{"id"}}

// Inbox is the workers' inbox, partitioned on processed_at. Its primary
// key becomes (consumer, message_id, processed_at), which cannot tell that
// a message was applied on another day: the worker claims a message in a
// partitioned inbox under a lock of its own instead of ON CONFLICT
// (inbox/claim.go).
var Inbox = Table{Name: "inbox", Key: "processed_at", PK: []string{"consumer", "message_id"}}

// Partition is one day's partition.
type Partition struct {
	Name     string
	From, To time.Time // [From, To)
	// Fenced: no row may enter it any more (see Fence).
	Fenced bool
}

// DefaultName is the name of t's default partition.
func (t Table) DefaultName() string { return t.Name + "_default" }

// dayName is the name of the partition of the UTC day that holds day.
func (t Table) dayName(day time.Time) string { return t.Name + "_p" + day.UTC().Format("20060102") }

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// literal is a timestamptz literal; t is ours, never a user's text.
func literal(t time.Time) string { return "'" + t.UTC().Format("2006-01-02 15:04:05Z07:00") + "'" }

// Beginner is what the upkeep runs on: a pool, a connection or a
// transaction (each statement then runs in a savepoint).
type Beginner interface {
	dbsqlc.DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// IsPartitioned reports whether t is a partitioned table.
func IsPartitioned(ctx context.Context, db dbsqlc.DBTX, t Table) (bool, error) {
	p, err := dbsqlc.New().PartitionIsPartitioned(ctx, db, t.Name)
	if err != nil {
		return false, fmt.Errorf("read the layout of table %s: %w", t.Name, err)
	}
	return p, nil
}

// Convert replaces t, which must be empty, with a table of the same
// columns, defaults and CHECK constraints partitioned by day on t.Key, with
// its default partition and the partitions of today and the Ahead days
// after now; the privileges other roles held on t are granted again, and
// every publication that named t names the new table, publishing its
// changes as t's (publish_via_partition_root), which is how the relay
// recognises the outbox. An already partitioned t is left as it is. A t
// holding a row is refused with ErrNotEmpty and left untouched: one
// transaction does all or nothing. Writers wait for it; it waits for them.
func Convert(ctx context.Context, db Beginner, t Table, now time.Time) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		q := dbsqlc.New()
		if _, err := tx.Exec(ctx, "LOCK TABLE "+ident(t.Name)+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return fmt.Errorf("lock table %s: %w", t.Name, err)
		}
		partitioned, err := IsPartitioned(ctx, tx, t)
		if err != nil || partitioned {
			return err
		}
		var nonEmpty bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+ident(t.Name)+")").Scan(&nonEmpty); err != nil {
			return fmt.Errorf("look for rows in %s: %w", t.Name, err)
		}
		if nonEmpty {
			return fmt.Errorf("%w: table %s holds rows, and Ferry converts only an empty %s to the partitioned layout "+
				"(moving rows would rewrite them all under a lock); nothing was changed. Convert before the first event, "+
				"or once retention has emptied it", ErrNotEmpty, t.Name, t.Name)
		}
		pubs, err := q.PartitionPublications(ctx, tx, t.Name)
		if err != nil {
			return fmt.Errorf("read the publications of %s: %w", t.Name, err)
		}
		grants, err := q.PartitionGrants(ctx, tx, t.Name)
		if err != nil {
			return fmt.Errorf("read the privileges on %s: %w", t.Name, err)
		}
		name, old := ident(t.Name), ident(t.Name+"_unpartitioned")
		pk := make([]string, 0, len(t.PK)+1)
		for _, c := range append(t.PK, t.Key) {
			pk = append(pk, ident(c))
		}
		stmts := []string{
			fmt.Sprintf("ALTER TABLE %s RENAME TO %s", name, old),
			// Columns, defaults, CHECK constraints and comments, whatever
			// migrations made them; indexes cannot be copied (a partitioned
			// table's unique index must hold the partition key).
			fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING ALL EXCLUDING INDEXES) PARTITION BY RANGE (%s)", name, old, ident(t.Key)),
			fmt.Sprintf("DROP TABLE %s", old),
			fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s PRIMARY KEY (%s)", name, ident(t.Name+"_pkey"), strings.Join(pk, ", ")),
			fmt.Sprintf("CREATE INDEX %s ON %s (%s)", ident(t.Name+"_"+t.Key+"_idx"), name, ident(t.Key)),
			fmt.Sprintf("CREATE TABLE %s PARTITION OF %s DEFAULT", ident(t.DefaultName()), name),
		}
		for _, g := range grants {
			grantee := "PUBLIC"
			if g.Grantee != "PUBLIC" {
				grantee = ident(g.Grantee)
			}
			stmts = append(stmts, fmt.Sprintf("GRANT %s ON %s TO %s", g.Privilege, name, grantee))
		}
		for _, p := range pubs {
			stmts = append(stmts,
				fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s", ident(p), name),
				fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true)", ident(p)))
		}
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("partition %s: %s: %w", t.Name, s, err)
			}
		}
		_, err = ensure(ctx, tx, t, now, false)
		return err
	})
}

// Ensure creates the missing partitions of the UTC days from now's to
// Ahead days later, and returns how many it created. A day whose rows
// already went to the default partition (nothing created it in time) is an
// error naming them: PostgreSQL refuses a partition whose range the default
// holds, and those rows have to be moved by hand.
func Ensure(ctx context.Context, db Beginner, t Table, now time.Time) (int, error) {
	return ensure(ctx, db, t, now, true)
}

func ensure(ctx context.Context, db Beginner, t Table, now time.Time, bounded bool) (int, error) {
	parts, err := List(ctx, db, t)
	if err != nil {
		return 0, err
	}
	first := now.UTC().Truncate(24 * time.Hour)
	created := 0
	for d := range Ahead + 1 {
		from := first.AddDate(0, 0, d)
		to := from.AddDate(0, 0, 1)
		if covered(parts, from, to) {
			continue
		}
		err := createDay(ctx, db, t, from, bounded)
		switch {
		case pgerr.DuplicateTable(err): // another relay created it first
		case pgerr.CheckViolation(err):
			return created, fmt.Errorf("create partition %s: rows of %s from %s to %s are in the default partition %s, "+
				"so PostgreSQL refuses the partition, and rows of that day keep going to the default partition, "+
				"which retention never drops: move them out of %s (copy and delete them), let the partition be created, then insert them again: %w",
				t.dayName(from), t.Name, literal(from), literal(to), t.DefaultName(), t.DefaultName(), err)
		case err != nil:
			return created, fmt.Errorf("create partition %s: %w", t.dayName(from), err)
		default:
			created++
		}
	}
	return created, nil
}

// CreateDay creates the partition of the UTC day of day, which Ensure
// does not for a day past (tests and benchmarks backdate rows), and
// returns its name.
func CreateDay(ctx context.Context, db Beginner, t Table, day time.Time) (string, error) {
	from := day.UTC().Truncate(24 * time.Hour)
	if err := createDay(ctx, db, t, from, true); err != nil {
		return "", fmt.Errorf("create partition %s: %w", t.dayName(from), err)
	}
	return t.dayName(from), nil
}

func createDay(ctx context.Context, db Beginner, t Table, from time.Time, bounded bool) error {
	return ddl(ctx, db, bounded, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (%s) TO (%s)",
		ident(t.dayName(from)), ident(t.Name), literal(from), literal(from.AddDate(0, 0, 1))))
}

func covered(parts []Partition, from, to time.Time) bool {
	for _, p := range parts {
		if p.From.Before(to) && p.To.After(from) {
			return true
		}
	}
	return false
}

// List returns t's partitions bounded on both sides, oldest first; not the
// default partition.
func List(ctx context.Context, db dbsqlc.DBTX, t Table) ([]Partition, error) {
	rows, err := dbsqlc.New().PartitionList(ctx, db, t.Name)
	if err != nil {
		return nil, fmt.Errorf("list the partitions of %s: %w", t.Name, err)
	}
	out := make([]Partition, len(rows))
	for i, r := range rows {
		out[i] = Partition{Name: r.Name, From: r.RangeFrom, To: r.RangeTo, Fenced: r.Fenced}
	}
	return out, nil
}

// Expired returns the partitions whose whole range ends at or before
// before: no row in them is newer.
func Expired(ctx context.Context, db dbsqlc.DBTX, t Table, before time.Time) ([]Partition, error) {
	parts, err := List(ctx, db, t)
	if err != nil {
		return nil, err
	}
	var out []Partition
	for _, p := range parts {
		if !p.To.After(before) {
			out = append(out, p)
		}
	}
	return out, nil
}

// Fence makes p refuse every new row, with a CHECK (false) constraint that
// does not check the rows it holds (NOT VALID), named p_expired: taking
// the lock it needs waits for every transaction writing into p to end, and
// from then on an insert into p fails (loudly: a check violation in the
// writer's transaction) instead of landing in a partition about to be
// dropped. So once Fence returned, every row p will ever hold is committed,
// below the current WAL insert position.
func Fence(ctx context.Context, db Beginner, p Partition) error {
	err := ddl(ctx, db, true, fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s CHECK (false) NOT VALID",
		ident(p.Name), ident(p.Name+"_expired")))
	if err != nil && !pgerr.DuplicateObject(err) {
		return fmt.Errorf("fence partition %s: %w", p.Name, err)
	}
	return nil
}

// Drop drops p, rows and all.
func Drop(ctx context.Context, db Beginner, p Partition) error {
	if err := ddl(ctx, db, true, "DROP TABLE IF EXISTS "+ident(p.Name)); err != nil {
		return fmt.Errorf("drop partition %s: %w", p.Name, err)
	}
	return nil
}

// Round is the start of a retention round: the partitions ahead created,
// the default partition looked at.
type Round struct {
	DB             Beginner // db, which the round's DDL needs to begin transactions on
	Created        int      // partitions created ahead
	DefaultHasRows bool
}

// StartRound starts a retention round of t on db: it creates the
// partitions ahead (Ensure) and looks for rows in the default partition.
func StartRound(ctx context.Context, db dbsqlc.DBTX, t Table, now time.Time) (*Round, error) {
	b, ok := db.(Beginner)
	if !ok {
		return nil, fmt.Errorf("the %s is partitioned, and its upkeep needs a pool, a connection or a transaction, not a %T", t.Name, db)
	}
	r := &Round{DB: b}
	var err error
	if r.Created, err = Ensure(ctx, b, t, now); err != nil {
		return r, err
	}
	r.DefaultHasRows, err = DefaultHasRows(ctx, db, t)
	return r, err
}

// DefaultHasRows reports whether t's default partition holds a row.
func DefaultHasRows(ctx context.Context, db dbsqlc.DBTX, t Table) (bool, error) {
	var found bool
	err := db.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+ident(t.DefaultName())+")").Scan(&found)
	if err != nil {
		return false, fmt.Errorf("look for rows in %s: %w", t.DefaultName(), err)
	}
	return found, nil
}

// ddl runs stmt in a transaction of its own (a savepoint inside one), with
// lock_timeout when bounded.
func ddl(ctx context.Context, db Beginner, bounded bool, stmt string) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if bounded {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, stmt)
		return err
	})
}
