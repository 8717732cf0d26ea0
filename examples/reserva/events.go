package reserva

import (
	"encoding/json"
	"errors"
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

// ErrInvalidOrder is wrapped by the errors of an order that breaks a rule or
// a limit (see MaxItems and the other limits).
var ErrInvalidOrder = errors.New("invalid order")

func decode[T any](payload []byte) (T, error) {
	var v T
	err := json.Unmarshal(payload, &v)
	return v, err
}
