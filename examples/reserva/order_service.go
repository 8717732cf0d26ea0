package reserva

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

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

// PlaceOrderOpts are the options of PlaceOrder; nil means none.
type PlaceOrderOpts struct {
	// IdempotencyKey, when set, makes a retry safe: the first request with
	// the key places the order, and the key is stored with it in the same
	// transaction; a later one with the same request places nothing and
	// gets that order back, and one with another request gets
	// ErrIdempotencyKeyReused. 1 to MaxIdempotencyKeyBytes of printable
	// ASCII. Keys never expire here; a real service deletes old ones.
	IdempotencyKey string
}

// PlaceOrderResult is what PlaceOrder did.
type PlaceOrderResult struct {
	ID uuid.UUID
	// Replayed: an earlier request with the same idempotency key placed
	// order ID, and nothing was written now.
	Replayed bool
}

// PlaceOrder writes the order, its items and its OrderPlaced event in one
// transaction: if any of them fails, none exists. An order that breaks a
// limit is refused with an error wrapping ErrInvalidOrder, before anything
// is written.
func (s *Service) PlaceOrder(ctx context.Context, req PlaceOrderRequest, opts *PlaceOrderOpts) (*PlaceOrderResult, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	var key string
	if opts != nil {
		key = opts.IdempotencyKey
	}
	var hash []byte
	if key != "" {
		if err := validateIdempotencyKey(key); err != nil {
			return nil, err
		}
		var err error
		if hash, err = requestHash(req); err != nil {
			return nil, err
		}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, err
	}
	res := &PlaceOrderResult{ID: id}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		if key != "" {
			prior, err := claimIdempotencyKey(ctx, tx, key, hash, id)
			if err != nil {
				return err
			}
			if prior != uuid.Nil {
				res.ID, res.Replayed = prior, true
				return nil
			}
		}
		return writeOrder(ctx, tx, id, req)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func writeOrder(ctx context.Context, tx pgx.Tx, id uuid.UUID, req PlaceOrderRequest) error {
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
	// A server span per request (OpenTelemetry's global provider and
	// propagator: no-ops until main sets them), so that outbox.Write in
	// PlaceOrder records it and the consumers' spans descend from it.
	return otelhttp.NewHandler(mux, "reserva", otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
		return cmp.Or(r.Pattern, r.Method+" "+r.URL.Path) // the route, as "POST /orders"
	}))
}

// The API server's timeouts. A request is small (MaxRequestBytes), so a
// client that takes longer than readTimeout to send one is too slow or
// hostile; without these a slow body or an idle keep-alive connection holds
// a connection and its goroutine for as long as the client likes.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second // headers and body
	writeTimeout      = 30 * time.Second // from the headers read to the answer written
	idleTimeout       = time.Minute      // between requests on a keep-alive connection
)

// Server returns an HTTP server for the order API on addr, with read, write
// and idle timeouts set.
func (s *Service) Server(addr string) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           s.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
	}
}

// handlePlace answers every bad request with a 4xx and a JSON error naming
// what is wrong: 415 for a body that is not JSON, 413 for one too large, 400
// for one that does not decode or a bad Idempotency-Key, 422 for an order
// that breaks a rule or reuses a key.
func (s *Service) handlePlace(w http.ResponseWriter, r *http.Request) {
	if err := requireJSON(r.Header); err != nil {
		writeError(w, http.StatusUnsupportedMediaType, err.Error())
		return
	}
	keys := r.Header.Values("Idempotency-Key")
	if len(keys) > 1 {
		writeError(w, http.StatusBadRequest, "Idempotency-Key: sent more than once")
		return
	}
	var opts PlaceOrderOpts
	if len(keys) == 1 {
		if err := validateIdempotencyKey(keys[0]); err != nil {
			writeError(w, http.StatusBadRequest, "Idempotency-Key: "+err.Error())
			return
		}
		opts.IdempotencyKey = keys[0]
	}
	req, status, err := decodeOrder(w, r)
	if err != nil {
		writeError(w, status, "body: "+err.Error())
		return
	}
	res, err := s.PlaceOrder(r.Context(), req, &opts)
	switch {
	case errors.Is(err, ErrInvalidOrder):
		writeError(w, http.StatusUnprocessableEntity, err.Error())
		return
	case errors.Is(err, ErrIdempotencyKeyReused):
		writeError(w, http.StatusUnprocessableEntity, "Idempotency-Key was used before with a different request; use a new key for a new order")
		return
	case err != nil:
		s.logger.Error("place order", slog.String("error", err.Error()))
		writeError(w, http.StatusInternalServerError, "could not place the order")
		return
	}
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	// A replay answers as the first request did, whatever the order's
	// status is now: GET /orders/{id} tells that.
	w.Header().Set("Location", "/orders/"+res.ID.String())
	writeJSON(w, http.StatusCreated, map[string]string{"id": res.ID.String(), "status": "placed"})
}

// requireJSON accepts application/json, in UTF-8 if a charset is given: a
// form or text body is a client mistake to answer, not to guess at.
func requireJSON(h http.Header) error {
	mt, params, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return errors.New("Content-Type must be application/json")
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return errors.New("Content-Type: charset must be utf-8")
	}
	return nil
}

// decodeOrder reads one JSON object of at most MaxRequestBytes, with no
// unknown fields and nothing after it.
func decodeOrder(w http.ResponseWriter, r *http.Request) (PlaceOrderRequest, int, error) {
	var req PlaceOrderRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err == nil {
		if _, next := dec.Token(); next != io.EOF {
			err = cmp.Or(next, errors.New("data after the JSON object"))
		}
	}
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return req, http.StatusRequestEntityTooLarge, fmt.Errorf("larger than %d bytes", MaxRequestBytes)
	}
	if err != nil {
		return req, http.StatusBadRequest, err
	}
	return req, 0, nil
}

func (s *Service) handleGet(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "id is not a UUID")
		return
	}
	o, err := s.Order(r.Context(), id)
	switch {
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case err != nil:
		s.logger.Error("get order", slog.String("error", err.Error()))
		writeError(w, http.StatusInternalServerError, "could not read the order")
	default:
		writeJSON(w, http.StatusOK, o)
	}
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
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
