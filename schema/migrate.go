// Package schema applies Ferry's SQL schema with goose migrations: Ferry's
// own tables, and any other embedded set such as an application's, each
// recorded in a version table of its own so that several sets share one
// database. (A broker migration, moving traffic between Kafka clusters, is
// package migration's.)
//
//	db := stdlib.OpenDBFromPool(pool) // or sql.Open("pgx", url)
//	if err := schema.Up(ctx, db); err != nil { ... }
package schema

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/crc64"
	"io/fs"
	"log/slog"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/ferryhq/ferry/db/migrations"
)

// FerryVersionTable is the goose version table of Ferry's own migrations. It is
// not goose's default (goose_db_version), so an application that runs goose
// for its own tables keeps its history apart from Ferry's.
const FerryVersionTable = "ferry_schema_version"

// Set is one sequence of goose SQL migrations and the table that records
// which of them ran.
type Set struct {
	// FS holds the migration files (NNNNN_name.sql) at its root.
	FS fs.FS
	// VersionTable records the applied versions. Required.
	VersionTable string
}

// Ferry is the set of Ferry's own tables: outbox, inbox, outbox_quarantine and
// ferry_relay_slot.
var Ferry = Set{FS: migrations.FS, VersionTable: FerryVersionTable}

// Migrator applies one Set to one database.
type Migrator struct {
	provider *goose.Provider
}

// Result describes one applied migration.
type Result struct {
	Version   int64
	Name      string
	Direction string // "up" or "down"
}

// New returns a Migrator of set for db. Concurrent migrators of the same set
// serialise on a PostgreSQL advisory lock derived from the version table's
// name. logger may be nil.
func New(db *sql.DB, set Set, logger *slog.Logger) (*Migrator, error) {
	if db == nil {
		return nil, errors.New("migrate: db is nil")
	}
	if set.FS == nil {
		return nil, errors.New("migrate: Set.FS is nil")
	}
	if set.VersionTable == "" {
		return nil, errors.New("migrate: Set.VersionTable is empty")
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID(set.VersionTable)))
	if err != nil {
		return nil, fmt.Errorf("migrate: session locker: %w", err)
	}
	logger = cmp.Or(logger, slog.New(slog.DiscardHandler))
	p, err := goose.NewProvider(goose.DialectPostgres, db, set.FS,
		goose.WithTableName(set.VersionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(logger),
	)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return &Migrator{provider: p}, nil
}

// lockID keys the advisory lock by version table, so two sets migrate
// independently while two migrators of one set take turns.
func lockID(table string) int64 {
	return int64(crc64.Checksum([]byte("ferry-migrate:"+table), crc64.MakeTable(crc64.ECMA)) >> 1)
}

// Up applies every pending migration.
func (m *Migrator) Up(ctx context.Context) ([]Result, error) {
	res, err := m.provider.Up(ctx)
	if err != nil {
		return results(res), fmt.Errorf("migrate up: %w", err)
	}
	return results(res), nil
}

// Down rolls back the newest applied migration.
func (m *Migrator) Down(ctx context.Context) (*Result, error) {
	res, err := m.provider.Down(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate down: %w", err)
	}
	r := results([]*goose.MigrationResult{res})
	return &r[0], nil
}

// DownTo rolls back every applied migration newer than version; 0 rolls back
// them all.
func (m *Migrator) DownTo(ctx context.Context, version int64) ([]Result, error) {
	res, err := m.provider.DownTo(ctx, version)
	if err != nil {
		return results(res), fmt.Errorf("migrate down to %d: %w", version, err)
	}
	return results(res), nil
}

// Version returns the newest applied version (0 when none) and the newest
// version available.
func (m *Migrator) Version(ctx context.Context) (current, latest int64, err error) {
	current, latest, err = m.provider.GetVersions(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("migrate version: %w", err)
	}
	return current, latest, nil
}

// Up applies Ferry's pending migrations to db.
func Up(ctx context.Context, db *sql.DB) error {
	m, err := New(db, Ferry, nil)
	if err != nil {
		return err
	}
	_, err = m.Up(ctx)
	return err
}

func results(in []*goose.MigrationResult) []Result {
	out := make([]Result, 0, len(in))
	for _, r := range in {
		if r == nil || r.Source == nil {
			continue
		}
		out = append(out, Result{Version: r.Source.Version, Name: r.Source.Path, Direction: r.Direction})
	}
	return out
}
