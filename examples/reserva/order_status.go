package reserva

import (
	"context"
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
	tag, err := tx.Exec(ctx, `
		UPDATE orders SET status = $2, reason = nullif($3, ''), decided_at = clock_timestamp()
		WHERE id = $1 AND status = 'placed'`, d.OrderID, status, d.Reason)
	if err != nil {
		return fmt.Errorf("update order %s: %w", d.OrderID, err)
	}
	if tag.RowsAffected() == 0 {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orders WHERE id = $1)`, d.OrderID).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			// Not Permanent: the decision can arrive a moment before the
			// order's transaction is visible here (PostgreSQL decodes a
			// commit once it is flushed, just before other sessions see
			// it). Retried, it applies; an order that never appears ends
			// in the dead-letter topic as retries_exhausted.
			return fmt.Errorf("order %s does not exist (yet)", d.OrderID)
		}
		// Already decided: the stock worker decides once per order.
	}
	return nil
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

// Register adds reserva's two workers to w under these names.
func (n Names) Register(w *inbox.Worker) error {
	w.Handle(n.StockConsumer, n.OrdersTopic, ReserveStock)
	w.Handle(n.StatusConsumer, n.StockTopic, UpdateOrderStatus)
	return nil
}

// Register adds reserva's two workers to w under DefaultNames. Pass it to
// workercli.Main (cmd/reserva-worker does), or call it before w.Run.
func Register(w *inbox.Worker) error { return DefaultNames.Register(w) }
