// Command quickstart shows the smallest use of Ferry: migrate, then write a
// business row and its events in one transaction.
//
//	go run ./examples/quickstart -database-url postgres://... -n 5
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/schema"
)

func main() {
	dbURL := flag.String("database-url", os.Getenv("FERRY_DATABASE_URL"), "PostgreSQL URL (env FERRY_DATABASE_URL)")
	n := flag.Int("n", 3, "how many events to write")
	flag.Parse()
	if *dbURL == "" {
		log.Fatal("quickstart: -database-url (FERRY_DATABASE_URL) is required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := migrateUp(ctx, stdlib.OpenDBFromPool(pool)); err != nil {
		log.Fatal(err)
	}

	events := make([]outbox.Event, *n)
	for i := range events {
		events[i] = outbox.Event{
			AggregateType: "order",
			AggregateID:   fmt.Sprintf("order-%d", i%3),
			EventType:     "OrderPlaced",
			Payload:       fmt.Appendf(nil, `{"seq":%d}`, i),
		}
	}
	var ids []uuid.UUID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Business rows are written here, in the same transaction.
		ids, err = outbox.Write(ctx, tx, events...)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	for i, id := range ids {
		fmt.Printf("wrote %s %s/%s %s\n", id, events[i].AggregateType, events[i].AggregateID, events[i].EventType)
	}
	var total int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&total); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("outbox now holds %d events\n", total)
}

func migrateUp(ctx context.Context, db *sql.DB) error {
	defer db.Close()
	return schema.Up(ctx, db)
}
