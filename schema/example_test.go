package schema_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"testing/fstest"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/ferryhq/ferry/schema"
)

// Apply Ferry's migrations at start-up (what `relay schema` does): Up
// applies the pending ones, and does nothing when there are none.
func ExampleUp() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	if err := schema.Up(ctx, db); err != nil {
		log.Fatal(err)
	}

	m, err := schema.New(db, schema.Ferry, nil)
	if err != nil {
		log.Fatal(err)
	}
	current, latest, err := m.Version(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("schema up to date:", current == latest && current > 0)
	res, err := m.Up(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("applied by a second Up:", len(res))
	var tables int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_tables WHERE tablename IN ('outbox', 'inbox', 'outbox_quarantine')`).Scan(&tables); err != nil {
		log.Fatal(err)
	}
	fmt.Println("outbox, inbox and quarantine tables:", tables)
	// Output:
	// schema up to date: true
	// applied by a second Up: 0
	// outbox, inbox and quarantine tables: 3
}

// An application's own migrations (normally an embed.FS of its SQL files)
// as a Set with a version table of its own: they go up and down beside
// Ferry's without touching them.
func ExampleMigrator() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	app := schema.Set{
		VersionTable: "app_schema_version",
		FS: fstest.MapFS{
			"00001_orders.sql":       {Data: []byte("-- +goose Up\nCREATE TABLE orders (id text PRIMARY KEY);\n-- +goose Down\nDROP TABLE orders;\n")},
			"00002_orders_total.sql": {Data: []byte("-- +goose Up\nALTER TABLE orders ADD total_cents bigint;\n-- +goose Down\nALTER TABLE orders DROP total_cents;\n")},
		},
	}
	m, err := schema.New(db, app, nil)
	if err != nil {
		log.Fatal(err)
	}
	version := func() {
		current, latest, err := m.Version(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("version %d of %d\n", current, latest)
	}

	applied, err := m.Up(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range applied {
		fmt.Println(r.Direction, r.Version, r.Name)
	}
	version()

	r, err := m.Down(ctx) // the newest one only
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Direction, r.Version, r.Name)
	version()

	rolled, err := m.DownTo(ctx, 0) // all of them
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("rolled back:", len(rolled))
	version()
	// Output:
	// up 1 00001_orders.sql
	// up 2 00002_orders_total.sql
	// version 2 of 2
	// down 2 00002_orders_total.sql
	// version 1 of 2
	// rolled back: 1
	// version 0 of 2
}
