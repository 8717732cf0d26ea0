package migration

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/dbsqlc"
)

// List returns where every plan stands, the oldest plan first.
func (c *Controller) List(ctx context.Context) ([]State, error) {
	var out []State
	err := pgx.BeginFunc(ctx, c.DB, func(tx pgx.Tx) error {
		plans, err := dbsqlc.New().MigrationList(ctx, tx)
		if err != nil {
			return err
		}
		for _, m := range plans {
			st, err := readState(ctx, tx, m.Name)
			if err != nil {
				return err
			}
			out = append(out, *st)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migration: list plans: %w", err)
	}
	return out, nil
}
