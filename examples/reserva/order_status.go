package reserva

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/inbox"
)

// UpdateOrderStatus is the order-status worker's handler for StockReserved
// and StockRejected: it moves the order out of "placed".
func UpdateOrderStatus(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
	var status string
	switch m.EventType {
	case EventStockReserved:
		status = "reserved"
	case EventStockRejected:
		status = "rejected"
	default:
		return nil
	}
	d, err := decode[StockDecision](m.Payload)
	if err != nil {
		return inbox.Undecodable(fmt.Errorf("%s payload: %w", m.EventType, err))
	}
	decide := func() (bool, error) {
		tag, err := tx.Exec(ctx, `
			UPDATE orders SET status = $2, reason = nullif($3, ''), decided_at = clock_timestamp()
			WHERE id = $1 AND status = 'placed'`, d.OrderID, status, d.Reason)
		if err != nil {
			return false, fmt.Errorf("update order %s: %w", d.OrderID, err)
		}
		return tag.RowsAffected() == 1, nil
	}
	done, err := decide()
	if err != nil || done {
		return err
	}
	// Nothing updated: the order is decided already, or not visible yet
	// (PostgreSQL decodes a commit once it is flushed, just before other
	// sessions see it), or became visible since the UPDATE's snapshot.
	var current string
	err = tx.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, d.OrderID).Scan(&current)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Not Permanent: retried, it applies once the order is visible; an
		// order that never appears ends in the dead-letter topic as
		// retries_exhausted.
		return fmt.Errorf("order %s does not exist (yet)", d.OrderID)
	case err != nil:
		return err
	case current != "placed":
		return nil // decided already: the stock worker decides once per order
	}
	// Visible now, still placed: decide it now. Never count the decision
	// applied without its effect.
	if done, err = decide(); err != nil || done {
		return err
	}
	return fmt.Errorf("order %s is placed but could not be decided; retrying", d.OrderID)
}

// Names are the topics and consumers reserva uses. Tests and side-by-side
// deployments give each instance its own.
type Names struct {
	OrdersTopic    string // OrderPlaced events
	StockTopic     string // StockReserved and StockRejected events
	StockConsumer  string // the stock-reservation worker
	StatusConsumer string // the order-status worker
}

// DefaultNames match the relay's default topic template.
var DefaultNames = Names{
	OrdersTopic:    TopicOrders,
	StockTopic:     TopicStock,
	StockConsumer:  ConsumerStockReservation,
	StatusConsumer: ConsumerOrderStatus,
}

// Register adds reserva's two workers to w under these names. The stock
// worker names the stock rows it locks (StockLocks), so that batches of
// orders never deadlock; the status worker updates each order's own row.
func (n Names) Register(w *inbox.Worker) error {
	w.HandleWith(n.StockConsumer, n.OrdersTopic, ReserveStock, &inbox.HandleOpts{Locks: StockLocks})
	w.Handle(n.StatusConsumer, n.StockTopic, UpdateOrderStatus)
	return nil
}

// Register adds reserva's two workers to w under DefaultNames. Pass it to
// workercli.Main (cmd/reserva-worker does), or call it before w.Run.
func Register(w *inbox.Worker) error { return DefaultNames.Register(w) }
