package cli

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/ferryhq/ferry/migrate"
)

// Migrate runs `<binary> migrate [up|down|status]` for Ferry's tables.
func Migrate(ctx context.Context, databaseURL, action string, out io.Writer, logger *slog.Logger) error {
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	m, err := migrate.New(db, migrate.Ferry, logger)
	if err != nil {
		return err
	}
	switch action {
	case "", "up":
		res, err := m.Up(ctx)
		for _, r := range res {
			fmt.Fprintf(out, "applied %s\n", r.Name)
		}
		if err != nil {
			return err
		}
	case "down":
		r, err := m.Down(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "rolled back %s\n", r.Name)
	case "status":
	default:
		return fmt.Errorf("migrate: unknown action %q: want up, down or status", action)
	}
	cur, latest, err := m.Version(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "schema version %d of %d (table %s)\n", cur, latest, migrate.FerryVersionTable)
	return nil
}
