package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/outbox"
)

// writerResult is the insert rate of application transactions writing the
// relay benchmark's events through outbox.Write.
type writerResult struct {
	clients, perTx int
	events         int64
	rate           float64 // events/s
}

// benchWriter commits events events through outbox.Write: clients
// concurrent transactions of perTx events each, shaped like the relay's
// backlog (1,000 aggregates, payload bytes, one header).
func benchWriter(ctx context.Context, pool *pgxpool.Pool, clients, perTx, events, payload int) (writerResult, error) {
	res := writerResult{clients: clients, perTx: perTx}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	body := make([]byte, payload)
	for i := range body {
		body[i] = 'x'
	}
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			batch := make([]outbox.Event, perTx)
			for {
				first := next.Add(int64(perTx)) - int64(perTx)
				if first >= int64(events) {
					return
				}
				for j := range batch {
					batch[j] = outbox.Event{AggregateType: "load", AggregateID: fmt.Sprintf("agg-%d", (first+int64(j))%1000),
						EventType: "Changed", Payload: body, Headers: map[string]string{"k": "v"}}
				}
				// One transaction per batch: outbox.Write takes the caller's.
				tx, err := pool.Begin(ctx)
				if err == nil {
					_, err = outbox.Write(ctx, tx, batch...)
					if err == nil {
						err = tx.Commit(ctx)
					} else {
						_ = tx.Rollback(ctx)
					}
				}
				if err != nil {
					errs <- fmt.Errorf("writer client %d: %w", c, err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		return res, err
	}
	// Every batch that started below events committed whole.
	res.events = (int64(events) + int64(perTx) - 1) / int64(perTx) * int64(perTx)
	res.rate = float64(res.events) / elapsed.Seconds()
	return res, nil
}
