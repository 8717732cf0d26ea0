package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/outbox"
)

// EventOrderNoted is the migration demo's note on an order. Reserva's
// stock worker consumes the orders topic and leaves every event but
// OrderPlaced alone, so a note changes nothing but the inbox, which records
// when the worker took it: enough to check that an aggregate's events are
// applied in the order they were written, across the move.
const EventOrderNoted = "OrderNoted"

// orderNote is an OrderNoted payload: the note's number on its order, from
// 1 (the order's OrderPlaced counts as 0).
type orderNote struct {
	OrderID string `json:"order_id"`
	Seq     int    `json:"seq"`
}

// noteWriter gives the first orders of the run a note every second until
// the run stops. One OrderPlaced per order would make every aggregate a
// single event, whose order nothing can get wrong; these aggregates live
// through every step of the plan.
type noteWriter struct {
	written atomic.Int64
}

// run writes the notes on the first count orders (one every second on
// each) until ctx ends, and returns ctx's error then.
func (n *noteWriter) run(ctx context.Context, pool *pgxpool.Pool, count int) error {
	if count == 0 {
		return nil
	}
	var ids []string
	for len(ids) < count {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		rows, err := pool.Query(ctx, `SELECT id::text FROM orders ORDER BY created_at, id LIMIT $1`, count)
		if err != nil {
			return fmt.Errorf("read the orders to note: %w", err)
		}
		ids = ids[:0]
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read the orders to note: %w", err)
		}
	}
	seq := make([]int, count)
	tick := time.NewTicker(time.Second / time.Duration(count))
	defer tick.Stop()
	for i := 0; ; i = (i + 1) % count {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		payload, _ := json.Marshal(orderNote{OrderID: ids[i], Seq: seq[i] + 1}) // strings and an int always marshal
		_, err := outbox.Write(ctx, pool, outbox.Event{AggregateType: reserva.AggregateOrder, AggregateID: ids[i],
			EventType: EventOrderNoted, Payload: payload, Headers: map[string]string{"content-type": "application/json"}})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("write a note on order %s: %w", ids[i], err)
		}
		seq[i]++
		n.written.Add(1)
	}
}
