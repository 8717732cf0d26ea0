package cli

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/ferryhq/ferry/schema"
)

// MigrateFlags are the settings of `<binary> schema [up|down|status]`
// (`<binary> migrate`, its first name, is the same command).
type MigrateFlags struct {
	Base
	yes        *bool
	partitions []partitionFlag
}

// partitionFlag is --outbox-partitioning or --inbox-partitioning.
type partitionFlag struct {
	name  string // the flag
	table string
	value *string
	apply func(context.Context, *sql.DB, schema.Partitioning) error
}

// RegisterPartitioning adds --<table>-partitioning: `schema up` then lays
// the (empty) table out partitioned by day with apply
// (schema.PartitionOutbox, schema.PartitionInbox) after the migrations.
func (m *MigrateFlags) RegisterPartitioning(f *Flags, table string, apply func(context.Context, *sql.DB, schema.Partitioning) error) {
	p := partitionFlag{name: table + "-partitioning", table: table, apply: apply}
	p.value = f.String(p.name, "", "daily: make the (empty) "+table+" a table partitioned by day, which retention empties "+
		"by dropping whole partitions; unset leaves the layout as it is")
	m.partitions = append(m.partitions, p)
}

// Register binds the settings to f, which takes the action as its argument.
func (m *MigrateFlags) Register(f *Flags) {
	m.Base.Register(f)
	f.TakesArgs(1)
	// No environment variable: a confirmation left there would confirm every
	// rollback.
	m.yes = f.FlagSet.Bool("yes", false, "down: roll back for real (it drops tables and their rows)")
}

// Migrate runs `<binary> schema [up|down|status]` on the database of the
// parsed settings: Ferry's tables first, then each of own in order. down
// rolls back one migration, of the last set that has one applied, and only
// with --yes. Every action first names the database it acts on.
func (m *MigrateFlags) Migrate(ctx context.Context, action string, out io.Writer, logger *slog.Logger, own ...schema.Set) error {
	switch action {
	case "", "up", "down", "status":
	default:
		return Usagef("migrate: unknown action %q: want up, down or status", action)
	}
	for _, p := range m.partitions {
		switch {
		case *p.value != "" && *p.value != string(schema.PartitionDaily):
			return Usagef("--%s (%s): %q: want %s, or leave it unset", p.name, EnvName(p.name), *p.value, schema.PartitionDaily)
		case *p.value != "" && action != "" && action != "up":
			return Usagef("--%s (%s) applies to up only, not %s", p.name, EnvName(p.name), action)
		}
	}
	target, err := m.DB.Target()
	if err != nil {
		return err
	}
	if action == "down" && !*m.yes {
		return Usagef("down rolls back the newest migration of %s, dropping what it created with its rows: add --yes to do it", target)
	}
	fmt.Fprintln(out, target)
	db, err := sql.Open("pgx", m.DB.URL)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	sets := append([]schema.Set{schema.Ferry}, own...)
	ms := make([]*schema.Migrator, len(sets))
	for i, set := range sets {
		if ms[i], err = schema.New(db, set, logger); err != nil {
			return err
		}
	}
	switch action {
	case "", "up":
		for _, m := range ms {
			res, err := m.Up(ctx)
			for _, r := range res {
				fmt.Fprintf(out, "applied %s\n", r.Name)
			}
			if err != nil {
				return err
			}
		}
		for _, p := range m.partitions {
			if *p.value == "" {
				continue
			}
			if err := p.apply(ctx, db, schema.Partitioning(*p.value)); err != nil {
				return err
			}
			fmt.Fprintf(out, "%s is partitioned %s\n", p.table, *p.value)
		}
	case "down":
		if err := migrateDown(ctx, ms, out); err != nil {
			return err
		}
	}
	for i, m := range ms {
		cur, latest, err := m.Version(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "schema version %d of %d (table %s)\n", cur, latest, sets[i].VersionTable)
	}
	return nil
}

func migrateDown(ctx context.Context, ms []*schema.Migrator, out io.Writer) error {
	for i := len(ms) - 1; i >= 0; i-- {
		cur, _, err := ms[i].Version(ctx)
		if err != nil {
			return err
		}
		if cur == 0 && i > 0 {
			continue
		}
		r, err := ms[i].Down(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "rolled back %s\n", r.Name)
		return nil
	}
	return nil
}
