package reserva

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Aggregate types, event types and the topics the relay's default template
// gives them.
const (
	AggregateOrder = "order"
	AggregateStock = "stock"

	EventOrderPlaced   = "OrderPlaced"
	EventStockReserved = "StockReserved"
	EventStockRejected = "StockRejected"

	TopicOrders = "outbox.event." + AggregateOrder
	TopicStock  = "outbox.event." + AggregateStock

	ConsumerStockReservation = "stock.reservation"
	ConsumerOrderStatus      = "order.status"
)

// Item is one line of an order.
type Item struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// OrderPlaced is published when an order is accepted.
type OrderPlaced struct {
	OrderID  uuid.UUID `json:"order_id"`
	Customer string    `json:"customer"`
	Items    []Item    `json:"items"`
	PlacedAt time.Time `json:"placed_at"`
}

// StockDecision is the payload of StockReserved and StockRejected; the
// event type says which.
type StockDecision struct {
	OrderID uuid.UUID `json:"order_id"`
	Items   []Item    `json:"items,omitempty"`
	Reason  string    `json:"reason,omitempty"`
}

var errInvalidOrder = errors.New("invalid order")

// validate checks what the API checks on the way in; a worker checks it
// again, since anything can be written to the outbox.
func validateItems(items []Item) error {
	if len(items) == 0 {
		return fmt.Errorf("%w: no items", errInvalidOrder)
	}
	seen := map[string]bool{}
	for _, it := range items {
		switch {
		case it.SKU == "":
			return fmt.Errorf("%w: item without sku", errInvalidOrder)
		case it.Qty <= 0:
			return fmt.Errorf("%w: sku %s: quantity %d is not positive", errInvalidOrder, it.SKU, it.Qty)
		case seen[it.SKU]:
			return fmt.Errorf("%w: sku %s listed twice", errInvalidOrder, it.SKU)
		}
		seen[it.SKU] = true
	}
	return nil
}

func decode[T any](payload []byte) (T, error) {
	var v T
	err := json.Unmarshal(payload, &v)
	return v, err
}
