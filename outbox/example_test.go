package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/outbox"
)

// Write an order and its OrderPlaced event in one pgx transaction: both commit
// or neither does.
func ExampleWrite() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The business change goes here, e.g. INSERT INTO orders ...
		ids, err := outbox.Write(ctx, tx, outbox.Event{
			AggregateType: "order",
			AggregateID:   "order-42",
			EventType:     "OrderPlaced",
			Payload:       []byte(`{"order_id":"order-42","total_cents":1999}`),
			Headers:       map[string]string{"content-type": "application/json"},
		})
		if err != nil {
			return err
		}
		fmt.Println("events written:", len(ids))
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: events written: 1
}

// The same through database/sql, with any PostgreSQL driver.
func ExampleWriteSQL() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // a no-op after Commit

	_, err = outbox.WriteSQL(ctx, tx,
		outbox.Event{AggregateType: "order", AggregateID: "order-7", EventType: "OrderPlaced", Payload: []byte(`{}`)},
		outbox.Event{AggregateType: "order", AggregateID: "order-7", EventType: "OrderPaid", Payload: []byte(`{}`)},
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("committed")
	// Output: committed
}

// Invalid events are refused before anything is written.
func ExampleEventError() {
	_, err := outbox.Write(context.Background(), nil, outbox.Event{AggregateType: "order", EventType: "OrderPlaced"})
	fmt.Println(err)
	// Output: outbox: event 0: aggregate_id: aggregate id is empty
}
