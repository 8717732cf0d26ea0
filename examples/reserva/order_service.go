package reserva

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/outbox"
)

// Service is the order service: an HTTP JSON API over the orders tables.
type Service struct {
	db     *pgxpool.Pool
	logger *slog.Logger
}

// NewService returns the order service. logger may be nil.
func NewService(db *pgxpool.Pool, logger *slog.Logger) *Service {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Service{db: db, logger: logger}
}

// PlaceOrderRequest is the body of POST /orders.
type PlaceOrderRequest struct {
	Customer string `json:"customer"`
	Items    []Item `json:"items"`
}

// OrderView is the body of GET /orders/{id}.
type OrderView struct {
	ID        uuid.UUID  `json:"id"`
	Customer  string     `json:"customer"`
	Status    string     `json:"status"`
	Reason    string     `json:"reason,omitempty"`
	Items     []Item     `json:"items"`
	CreatedAt time.Time  `json:"created_at"`
	DecidedAt *time.Time `json:"decided_at,omitempty"`
}

// ErrNotFound is returned for an order that does not exist.
var ErrNotFound = errors.New("order not found")

// PlaceOrder writes the order, its items and its OrderPlaced event in one
// transaction: if any of them fails, none exists.
func (s *Service) PlaceOrder(ctx context.Context, req PlaceOrderRequest) (uuid.UUID, error) {
	if req.Customer == "" {
		return uuid.Nil, fmt.Errorf("%w: customer is empty", errInvalidOrder)
	}
	if err := validateItems(req.Items); err != nil {
		return uuid.Nil, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.Nil, err
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var placedAt time.Time
		if err := tx.QueryRow(ctx, `INSERT INTO orders (id, customer) VALUES ($1, $2) RETURNING created_at`, id, req.Customer).Scan(&placedAt); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		for _, it := range req.Items {
			if _, err := tx.Exec(ctx, `INSERT INTO order_items (order_id, sku, qty) VALUES ($1, $2, $3)`, id, it.SKU, it.Qty); err != nil {
				return fmt.Errorf("insert item %s: %w", it.SKU, err)
			}
		}
		payload, err := json.Marshal(OrderPlaced{OrderID: id, Customer: req.Customer, Items: req.Items, PlacedAt: placedAt})
		if err != nil {
			return err
		}
		_, err = outbox.Write(ctx, tx, outbox.Event{
			AggregateType: AggregateOrder,
			AggregateID:   id.String(),
			EventType:     EventOrderPlaced,
			Payload:       payload,
			Headers:       map[string]string{"content-type": "application/json"},
		})
		return err
	})
	if err != nil {
		return uuid.Nil, err
	}
	return id, nil
}

// Order reads an order and its items.
func (s *Service) Order(ctx context.Context, id uuid.UUID) (*OrderView, error) {
	o := &OrderView{ID: id, Items: []Item{}}
	var reason *string
	err := s.db.QueryRow(ctx, `SELECT customer, status, reason, created_at, decided_at FROM orders WHERE id = $1`, id).
		Scan(&o.Customer, &o.Status, &reason, &o.CreatedAt, &o.DecidedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	if reason != nil {
		o.Reason = *reason
	}
	rows, err := s.db.Query(ctx, `SELECT sku, qty FROM order_items WHERE order_id = $1 ORDER BY sku`, id)
	if err != nil {
		return nil, err
	}
	items, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Item])
	if err != nil {
		return nil, err
	}
	o.Items = append(o.Items, items...)
	return o, nil
}

// Handler serves POST /orders, GET /orders/{id} and GET /healthz.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", s.handlePlace)
	mux.HandleFunc("GET /orders/{id}", s.handleGet)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.db.Ping(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

func (s *Service) handlePlace(w http.ResponseWriter, r *http.Request) {
	var req PlaceOrderRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body: " + err.Error()})
		return
	}
	id, err := s.PlaceOrder(r.Context(), req)
	switch {
	case errors.Is(err, errInvalidOrder):
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": err.Error()})
		return
	case err != nil:
		s.logger.Error("place order", slog.String("error", err.Error()))
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "could not place the order"})
		return
	}
	w.Header().Set("Location", "/orders/"+id.String())
	writeJSON(w, http.StatusCreated, map[string]string{"id": id.String(), "status": "placed"})
}

func (s *Service) handleGet(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "id is not a UUID"})
		return
	}
	o, err := s.Order(r.Context(), id)
	switch {
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case err != nil:
		s.logger.Error("get order", slog.String("error", err.Error()))
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "could not read the order"})
	default:
		writeJSON(w, http.StatusOK, o)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// SeedStock sets the available quantity of each SKU.
func SeedStock(ctx context.Context, db *pgxpool.Pool, stock map[string]int) error {
	for sku, n := range stock {
		if _, err := db.Exec(ctx, `
			INSERT INTO stock (sku, name, available) VALUES ($1, $1, $2)
			ON CONFLICT (sku) DO UPDATE SET available = excluded.available`, sku, n); err != nil {
			return fmt.Errorf("seed stock %s: %w", sku, err)
		}
	}
	return nil
}
