package outbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Event is one message to publish. AggregateType, AggregateID and EventType
// are required.
type Event struct {
	// ID identifies the event for its whole life: it travels in the Kafka "id"
	// header and consumers deduplicate on it. Leave it zero and the writer
	// makes a UUIDv7, which sorts by creation time.
	ID uuid.UUID

	// AggregateType names the kind of entity the event is about ("order").
	// The relay derives the Kafka topic from it.
	AggregateType string

	// AggregateID identifies the entity ("42"). It is the Kafka record key, so
	// all events of one aggregate land in one partition in commit order.
	AggregateID string

	// EventType names what happened ("OrderPlaced").
	EventType string

	// Payload is the record value, published byte for byte. A nil payload is
	// stored and published as an empty value.
	Payload []byte

	// Headers become Kafka record headers next to the ones Ferry sets. Keys
	// must be non-empty, and keys and values valid UTF-8 without NUL bytes.
	// The names in ReservedHeaders are Ferry's and cannot be used.
	Headers map[string]string
}

// Names of the Kafka headers the relay sets on every record. They are the
// event's wire names: the relay writes them, the inbox reads them, and
// nothing else spells them out.
const (
	// HeaderID carries Event.ID, the id consumers deduplicate on.
	HeaderID = "id"
	// HeaderEventType carries Event.EventType.
	HeaderEventType = "event_type"
	// HeaderAggregateType carries Event.AggregateType.
	HeaderAggregateType = "aggregate_type"
	// HeaderAggregateID carries Event.AggregateID (also the record key).
	HeaderAggregateID = "aggregate_id"
)

// ReservedHeaders are the Kafka headers the relay sets on every record; an
// event may not carry its own headers with these names.
var ReservedHeaders = []string{HeaderID, HeaderEventType, HeaderAggregateType, HeaderAggregateID}

// ReservedHeaderPrefix starts the names of the headers Ferry's workers set
// (ferry.dlq.* on a dead letter, ferry.redrive.from on a redriven record);
// an event may not carry its own headers with such names either.
const ReservedHeaderPrefix = "ferry."

// IsReservedHeader reports whether name is Ferry's: one of ReservedHeaders
// or starting with ReservedHeaderPrefix. The writer refuses such a header,
// the outbox table's check constraint refuses it from SQL, and the relay
// quarantines a row that has one anyway (an older table).
func IsReservedHeader(name string) bool {
	return slices.Contains(ReservedHeaders, name) || strings.HasPrefix(name, ReservedHeaderPrefix)
}

// Validation errors. A failed Write returns them wrapped in an *EventError, so
// errors.Is(err, outbox.ErrPayloadTooLarge) tells the cause and errors.As
// gives the position of the offending event.
var (
	ErrEmptyAggregateType = errors.New("aggregate type is empty")
	ErrEmptyAggregateID   = errors.New("aggregate id is empty")
	ErrEmptyEventType     = errors.New("event type is empty")
	ErrPayloadTooLarge    = errors.New("payload is too large")
	ErrRecordTooLarge     = errors.New("event is too large for one Kafka record")
	ErrInvalidHeader      = errors.New("invalid header")
	ErrInvalidText        = errors.New("text is not valid UTF-8 or contains a NUL byte")
)

// EventError reports why the event at Index of a Write call was refused.
// Nothing of that call was written.
type EventError struct {
	Index int    // position of the event in the call
	Field string // "aggregate_type", "aggregate_id", "event_type", "payload", "headers", or "record" for the event as a whole
	Err   error  // one of the ErrXxx values, possibly wrapped with detail
}

func (e *EventError) Error() string {
	return fmt.Sprintf("outbox: event %d: %s: %v", e.Index, e.Field, e.Err)
}

func (e *EventError) Unwrap() error { return e.Err }

// validate checks one event against the writer's limits.
func validate(i int, ev *Event, maxPayload int) error {
	fail := func(field string, err error) error { return &EventError{Index: i, Field: field, Err: err} }
	for _, f := range []struct {
		name, value string
		empty       error
	}{
		{"aggregate_type", ev.AggregateType, ErrEmptyAggregateType},
		{"aggregate_id", ev.AggregateID, ErrEmptyAggregateID},
		{"event_type", ev.EventType, ErrEmptyEventType},
	} {
		if f.value == "" {
			return fail(f.name, f.empty)
		}
		if !validText(f.value) {
			return fail(f.name, ErrInvalidText)
		}
	}
	if len(ev.Payload) > maxPayload {
		return fail("payload", fmt.Errorf("%w: %d bytes, limit %d", ErrPayloadTooLarge, len(ev.Payload), maxPayload))
	}
	for k, v := range ev.Headers {
		switch {
		case k == "":
			return fail("headers", fmt.Errorf("%w: empty name", ErrInvalidHeader))
		case IsReservedHeader(k):
			return fail("headers", fmt.Errorf("%w: %q is reserved for Ferry", ErrInvalidHeader, k))
		case !validText(k):
			return fail("headers", fmt.Errorf("%w: name %q: %w", ErrInvalidHeader, k, ErrInvalidText))
		case !validText(v):
			return fail("headers", fmt.Errorf("%w: value of %q: %w", ErrInvalidHeader, k, ErrInvalidText))
		}
	}
	// Subtracting keeps a limit near math.MaxInt from overflowing.
	if n := recordBatchBytes(ev); n-RecordReserveBytes > maxPayload {
		return fail("record", fmt.Errorf("%w: %d bytes with its key and headers, limit %d (the payload limit plus %d)",
			ErrRecordTooLarge, n, maxPayload+RecordReserveBytes, RecordReserveBytes))
	}
	return nil
}

// validText accepts what PostgreSQL text and jsonb can store unchanged.
func validText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}
