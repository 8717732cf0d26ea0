package bridge_test

import (
	"context"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/migration/bridge"
)

// A bridge for a plan named move-1: the legacy producers' topics orders
// and payments keep their names on the new cluster, except orders, which
// becomes orders.v2; records without an id header get one derived from
// their key and value.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // the producer's PostgreSQL, which holds the plan
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	b, err := bridge.New(&bridge.Config{
		Plan:     "move-1",
		DB:       pool,
		Topics:   []string{"orders", "payments"},
		TopicMap: map[string]string{"orders": "orders.v2"},
		Logger:   slog.Default(),
	})
	if err != nil {
		panic(err)
	}
	// Until SIGTERM: the offsets committed so far are where a restart
	// resumes.
	if err := b.Run(ctx); err != nil {
		panic(err)
	}
}
