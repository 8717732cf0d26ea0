package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/outbox"
)

// A worker for the consumer "billing": each OrderPlaced event creates an
// invoice and chains an InvoiceCreated event through the outbox, all in the
// transaction that records the message in the inbox.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	kafka := []kgo.Opt{kgo.SeedBrokers(strings.Split(os.Getenv("KAFKA_BROKERS"), ",")...)}
	topic := os.Getenv("EXAMPLE_TOPIC") // normally "outbox.event.order"

	w, err := inbox.New(&inbox.Config{DB: pool, KafkaOpts: kafka})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	var once sync.Once
	w.Handle("billing", topic, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if m.EventType != "OrderPlaced" {
			return nil // not for us; the inbox still records it
		}
		// The effect would be an INSERT INTO invoices ... through tx.
		_, err := outbox.Write(ctx, tx, outbox.Event{
			AggregateType: "invoice",
			AggregateID:   m.AggregateID,
			EventType:     "InvoiceCreated",
			Payload:       m.Payload,
		})
		once.Do(func() {
			fmt.Printf("%s %s applied on attempt %d\n", m.EventType, m.AggregateID, m.Attempt)
			stop() // end the example: Run drains, commits and returns
		})
		return err
	})

	// What the relay would publish for an outbox row.
	producer, err := kgo.NewClient(kafka...)
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	err = producer.ProduceSync(ctx, &kgo.Record{
		Topic: topic, Key: []byte("order-42"), Value: []byte(`{"total_cents":1999}`),
		Headers: []kgo.RecordHeader{
			{Key: "id", Value: []byte("0190f5c4-5b7e-7d2a-9c1e-4a7b2f1e0c42")},
			{Key: "event_type", Value: []byte("OrderPlaced")},
			{Key: "aggregate_type", Value: []byte("order")},
			{Key: "aggregate_id", Value: []byte("order-42")},
		},
	}).FirstErr()
	if err != nil {
		log.Fatal(err)
	}

	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("processed:", w.Stats().Processed)
	// Output:
	// OrderPlaced order-42 applied on attempt 1
	// processed: 1
}

// Wrap an error with Permanent when retrying cannot help: the message goes
// to the dead-letter topic at once.
func ExamplePermanent() {
	errNoSuchOrder := errors.New("no such order")
	err := fmt.Errorf("reserve stock: %w", inbox.Permanent(errNoSuchOrder))
	fmt.Println(inbox.IsPermanent(err), errors.Is(err, errNoSuchOrder))
	// Output: true true
}

// Middleware wraps every handler of a worker, e.g. to log each message.
func ExampleChain() {
	logged := func(next inbox.Handler) inbox.Handler {
		return func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
			err := next(ctx, tx, m)
			fmt.Printf("%s attempt %d: %v\n", m.ID, m.Attempt, err)
			return err
		}
	}
	h := inbox.Chain(func(context.Context, pgx.Tx, *inbox.Message) error { return nil }, logged)
	_ = h(context.Background(), nil, &inbox.Message{ID: "m-1", Attempt: 1})
	// Output: m-1 attempt 1: <nil>
}

// Prune refuses a dedupe window shorter than its safety minimum before it
// touches the database.
func ExamplePrune() {
	_, err := inbox.Prune(context.Background(), nil, &inbox.PruneConfig{InboxRetention: time.Hour})
	fmt.Println(errors.Is(err, inbox.ErrRetentionTooShort))
	// Output: true
}
