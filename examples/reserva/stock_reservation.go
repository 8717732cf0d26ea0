package reserva

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/outbox"
)

// ReserveStock is the stock-reservation worker's handler for OrderPlaced.
// In the worker's transaction it takes the stock of every item or of none,
// records the outcome and writes StockReserved or StockRejected through the
// outbox, so the outcome and its event commit together, once.
func ReserveStock(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
	if m.EventType != EventOrderPlaced {
		return nil // other order events are not this worker's business
	}
	order, err := decode[OrderPlaced](m.Payload)
	if err != nil {
		return inbox.Undecodable(fmt.Errorf("OrderPlaced payload: %w", err))
	}
	if err := validateItems(order.Items); err != nil {
		return inbox.Permanent(err)
	}
	if order.OrderID.String() != m.AggregateID {
		return inbox.Permanent(fmt.Errorf("%w: order_id %s differs from the aggregate id %q", ErrInvalidOrder, order.OrderID, m.AggregateID))
	}

	reason, err := takeStock(ctx, tx, order.Items)
	if err != nil {
		return err // a database error: retried
	}
	outcome, eventType := "reserved", EventStockReserved
	decision := StockDecision{OrderID: order.OrderID, Items: order.Items}
	if reason != "" {
		outcome, eventType = "rejected", EventStockRejected
		decision = StockDecision{OrderID: order.OrderID, Reason: reason}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, outcome, reason) VALUES ($1, $2, nullif($3, ''))`,
		order.OrderID, outcome, reason); err != nil {
		return fmt.Errorf("record reservation of order %s: %w", order.OrderID, err)
	}
	payload, err := json.Marshal(decision)
	if err != nil {
		return err
	}
	_, err = outbox.Write(ctx, tx, outbox.Event{
		AggregateType: AggregateStock,
		AggregateID:   order.OrderID.String(),
		EventType:     eventType,
		Payload:       payload,
		Headers:       map[string]string{"content-type": "application/json", "causation-id": m.ID},
	})
	return err
}

// StockLocks names the stock rows ReserveStock locks for m, "stock:" + SKU,
// for the worker's HandleOpts.Locks. The worker applies several orders in
// one transaction and several transactions at once: each order locks its
// SKUs in order, but a batch of orders would take them in whatever order
// its orders come, against another batch, a deadlock. Named here, every
// transaction takes the stock of all its orders first, in one order.
func StockLocks(m *inbox.Message) []string {
	if m.EventType != EventOrderPlaced {
		return nil
	}
	order, err := decode[OrderPlaced](m.Payload)
	if err != nil {
		return nil // ReserveStock dead-letters it, locking nothing
	}
	locks := make([]string, len(order.Items))
	for i, it := range order.Items {
		locks[i] = "stock:" + it.SKU
	}
	return locks
}

// takeStock decrements every item's stock, or none. It locks the rows in
// SKU order, so concurrent orders never deadlock, and returns why it could
// not reserve ("" when it did).
func takeStock(ctx context.Context, tx pgx.Tx, items []Item) (reason string, err error) {
	items = slices.Clone(items)
	slices.SortFunc(items, func(a, b Item) int { return strings.Compare(a.SKU, b.SKU) })
	skus := make([]string, len(items))
	for i, it := range items {
		skus[i] = it.SKU
	}
	rows, err := tx.Query(ctx, `SELECT sku, available FROM stock WHERE sku = ANY($1) ORDER BY sku FOR UPDATE`, skus)
	if err != nil {
		return "", fmt.Errorf("lock stock: %w", err)
	}
	available := map[string]int{}
	for rows.Next() {
		var sku string
		var n int
		if err := rows.Scan(&sku, &n); err != nil {
			rows.Close()
			return "", err
		}
		available[sku] = n
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("lock stock: %w", err)
	}
	for _, it := range items {
		n, ok := available[it.SKU]
		switch {
		case !ok:
			return fmt.Sprintf("unknown sku %s", it.SKU), nil
		case n < it.Qty:
			return fmt.Sprintf("insufficient stock for %s: %d wanted, %d available", it.SKU, it.Qty, n), nil
		}
	}
	for _, it := range items {
		if _, err := tx.Exec(ctx, `UPDATE stock SET available = available - $2 WHERE sku = $1`, it.SKU, it.Qty); err != nil {
			return "", fmt.Errorf("take stock of %s: %w", it.SKU, err)
		}
	}
	return "", nil
}
