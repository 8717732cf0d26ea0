package migration_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/migration"
)

// Plan a move of the order topics to another cluster and start it: a
// request the phase machine forbids is rejected with its reason, DUAL_WRITE
// is accepted, and every request stays in the plan's history.
func ExampleController() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // the producer's PostgreSQL, where the relay reads the steps
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Evidence (ReportEvidence: the workers' reports) is asked for only
	// before CUTOVER and OLD_RETIRED, which this example does not reach.
	c := &migration.Controller{DB: pool}
	err = c.Create(ctx, migration.Plan{
		Name:   "orders-to-b",
		Old:    migration.Channel{Brokers: []string{"kafka-a:9092"}, TopicTemplate: "outbox.event.{aggregate_type}"},
		New:    migration.Channel{Brokers: []string{"kafka-b:9092"}, TopicTemplate: "outbox.event.{aggregate_type}"},
		Groups: []string{"billing", "stock.reservation"},
	}, "ops@example.com")
	if err != nil {
		log.Fatal(err)
	}

	for _, to := range []migration.Phase{migration.Cutover, migration.DualWrite} {
		slices := 0
		if to == migration.Cutover {
			slices = 8
		}
		d, err := c.Request(ctx, "orders-to-b", to, slices, "ops@example.com")
		if err != nil { // the database failed; a rejection is no error
			log.Fatal(err)
		}
		fmt.Printf("%s -> %s: accepted %t, epoch %d\n  %s\n", d.From, d.To, d.Accepted, d.Epoch, d.Reason)
	}

	st, err := c.State(ctx, "orders-to-b")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("now %s, epoch %d, %d of %d slices moved\n", st.Phase, st.Epoch, st.Moved(), migration.Slices)

	history, err := c.History(ctx, "orders-to-b")
	if err != nil {
		log.Fatal(err)
	}
	for _, h := range history {
		fmt.Printf("history: %s asked %s -> %s, accepted %t\n", h.By, h.From, h.To, h.Accepted)
	}
	// Output:
	// OLD_ONLY -> CUTOVER: accepted false, epoch 0
	//   forbidden: OLD_ONLY -> CUTOVER (from OLD_ONLY: DUAL_WRITE)
	// OLD_ONLY -> DUAL_WRITE: accepted true, epoch 1
	//   accepted: the relay writes both channels from this point of the commit order; the old copy is authoritative
	// now DUAL_WRITE, epoch 1, 0 of 128 slices moved
	// history: ops@example.com asked OLD_ONLY -> CUTOVER, accepted false
	// history: ops@example.com asked OLD_ONLY -> DUAL_WRITE, accepted true
}
