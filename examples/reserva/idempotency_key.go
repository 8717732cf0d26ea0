package reserva

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// MaxIdempotencyKeyBytes is the longest Idempotency-Key: room for a UUID or
// any client's own scheme, as payment APIs allow.
const MaxIdempotencyKeyBytes = 255

var (
	// ErrInvalidIdempotencyKey is returned for a key that is empty, too long
	// or not printable ASCII (space included, as HTTP header strings are).
	ErrInvalidIdempotencyKey = errors.New("invalid idempotency key")
	// ErrIdempotencyKeyReused is returned when a key comes back with another
	// request: answering with the first order would tell the client its new
	// request succeeded.
	ErrIdempotencyKeyReused = errors.New("idempotency key was used with a different request")
)

func validateIdempotencyKey(key string) error {
	if key == "" || len(key) > MaxIdempotencyKeyBytes {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidIdempotencyKey, len(key), MaxIdempotencyKeyBytes)
	}
	for i := range len(key) {
		if key[i] < ' ' || key[i] > '~' {
			return fmt.Errorf("%w: byte %d is not printable ASCII", ErrInvalidIdempotencyKey, i)
		}
	}
	return nil
}

// requestHash fingerprints a request as decoded, so a retry that spaces or
// orders its JSON fields differently is still the same request.
func requestHash(req PlaceOrderRequest) ([]byte, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// claimIdempotencyKey records in tx that key makes order id, before the order
// is written. If an earlier request holds the key it returns that request's
// order instead (uuid.Nil when the key was free). A concurrent request with
// the same key that has not committed yet makes the INSERT wait for it: on
// its commit the key is taken and its order returned, on its rollback this
// request takes the key. So identical concurrent requests make one order.
func claimIdempotencyKey(ctx context.Context, tx pgx.Tx, key string, hash []byte, id uuid.UUID) (uuid.UUID, error) {
	tag, err := tx.Exec(ctx, `
		INSERT INTO order_idempotency_keys (key, request_hash, order_id) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO NOTHING`, key, hash, id)
	if err != nil {
		return uuid.Nil, fmt.Errorf("claim idempotency key: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return uuid.Nil, nil
	}
	// Read committed: this statement sees the row the conflict was with.
	var prior uuid.UUID
	var priorHash []byte
	if err := tx.QueryRow(ctx, `SELECT order_id, request_hash FROM order_idempotency_keys WHERE key = $1`, key).
		Scan(&prior, &priorHash); err != nil {
		return uuid.Nil, fmt.Errorf("read idempotency key: %w", err)
	}
	if string(priorHash) != string(hash) {
		return uuid.Nil, ErrIdempotencyKeyReused
	}
	return prior, nil
}
