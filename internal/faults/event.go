package faults

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Kinds of events the load generator writes.
const (
	// KindVersioned is an ordinary event: version v of its aggregate. The
	// checker worker applies it and checks it follows version v-1.
	KindVersioned = "versioned"
	// KindPoison is refused by the handler with inbox.Permanent: it must
	// end in the dead-letter topic of every consumer, with its reason.
	KindPoison = "poison"
	// KindHuge has a payload larger than the topic's max.message.bytes: the
	// relay must quarantine it.
	KindHuge = "huge"
)

// AggregateType is the aggregate type of every event the suite writes; the
// relay's topic template turns it into the run's topic.
const AggregateType = "item"

// HeaderVersion carries an event's per-aggregate version, so that the checker
// reads it from the outbox row without decoding the payload.
const HeaderVersion = "version"

// eventBody is the JSON payload of an event (huge events carry raw bytes
// after it, so that compression cannot shrink them under the limit).
type eventBody struct {
	Kind      string `json:"k"`
	Aggregate string `json:"a"`
	Version   int64  `json:"v,omitempty"`
}

func encodeBody(b eventBody, pad []byte) []byte {
	out, _ := json.Marshal(b) // cannot fail: strings and an integer
	return append(out, pad...)
}

// decodeBody reads the JSON object at the start of a payload, ignoring any
// padding after it.
func decodeBody(payload []byte) (eventBody, error) {
	var b eventBody
	dec := json.NewDecoder(bytes.NewReader(payload))
	if err := dec.Decode(&b); err != nil {
		return b, fmt.Errorf("decode event payload: %w", err)
	}
	if b.Kind == "" || b.Aggregate == "" {
		return b, fmt.Errorf("event payload without kind or aggregate: %.80q", payload)
	}
	return b, nil
}

// aggregateName is the id of versioned aggregate i.
func aggregateName(i int) string { return fmt.Sprintf("agg-%04d", i) }
