package reserva

import (
	"fmt"
	"regexp"
	"unicode"
	"unicode/utf8"
)

// Limits of an order, checked before anything is written. Together they keep
// an OrderPlaced event, and the StockReserved or StockRejected event made
// from it, at about 10 KB at most: far inside any Kafka topic's record
// limit, so the relay never has to quarantine an order's event and leave the
// order placed forever. Copy the idea, not the numbers: bound every field a
// request can make large.
const (
	// MaxCustomerChars is the longest customer name, in characters.
	MaxCustomerChars = 200
	// MaxItems is the most lines one order may have.
	MaxItems = 100
	// MaxSKUBytes is the longest SKU. SKUs are letters, digits, '.', '_'
	// and '-', starting with a letter or digit.
	MaxSKUBytes = 64
	// MaxQty is the largest quantity of one line; it keeps quantities far
	// inside PostgreSQL's int (the qty and available columns).
	MaxQty = 1_000_000
	// MaxRequestBytes is the largest body POST /orders reads: several times
	// the largest valid order, so only abuse reaches it.
	MaxRequestBytes = 64 << 10
)

var validSKU = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// validate checks a request against the limits; its errors wrap
// ErrInvalidOrder and name the field.
func (r *PlaceOrderRequest) validate() error {
	if err := validateCustomer(r.Customer); err != nil {
		return err
	}
	return validateItems(r.Items)
}

func validateCustomer(c string) error {
	switch {
	case c == "":
		return fmt.Errorf("%w: customer is empty", ErrInvalidOrder)
	case !utf8.ValidString(c):
		return fmt.Errorf("%w: customer is not UTF-8", ErrInvalidOrder)
	case utf8.RuneCountInString(c) > MaxCustomerChars:
		return fmt.Errorf("%w: customer is longer than %d characters", ErrInvalidOrder, MaxCustomerChars)
	}
	// Control characters (NUL, which PostgreSQL text cannot hold, and
	// terminal escapes) have no place in a name shown to people.
	for _, r := range c {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: customer holds the control character %U", ErrInvalidOrder, r)
		}
	}
	return nil
}

// validateItems checks what the API checks on the way in; a worker checks it
// again, since anything can be written to the outbox. Items are named by
// position: a bad SKU is not worth repeating back.
func validateItems(items []Item) error {
	switch {
	case len(items) == 0:
		return fmt.Errorf("%w: no items", ErrInvalidOrder)
	case len(items) > MaxItems:
		return fmt.Errorf("%w: %d items, at most %d", ErrInvalidOrder, len(items), MaxItems)
	}
	seen := map[string]bool{}
	for i, it := range items {
		switch {
		case it.SKU == "":
			return fmt.Errorf("%w: items[%d]: item without sku", ErrInvalidOrder, i)
		case len(it.SKU) > MaxSKUBytes:
			return fmt.Errorf("%w: items[%d]: sku is longer than %d bytes", ErrInvalidOrder, i, MaxSKUBytes)
		case !validSKU.MatchString(it.SKU):
			return fmt.Errorf("%w: items[%d]: sku may hold only letters, digits, '.', '_' and '-'", ErrInvalidOrder, i)
		case it.Qty <= 0:
			return fmt.Errorf("%w: items[%d]: sku %s: quantity %d is not positive", ErrInvalidOrder, i, it.SKU, it.Qty)
		case it.Qty > MaxQty:
			return fmt.Errorf("%w: items[%d]: sku %s: quantity %d is more than %d", ErrInvalidOrder, i, it.SKU, it.Qty, MaxQty)
		case seen[it.SKU]:
			return fmt.Errorf("%w: items[%d]: sku %s listed twice", ErrInvalidOrder, i, it.SKU)
		}
		seen[it.SKU] = true
	}
	return nil
}
