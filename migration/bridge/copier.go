package bridge

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/payloadid"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/outbox"
)

// copier makes the new channel's copy of an old record.
type copier struct {
	plan        string
	idHeader    string
	fromPayload bool
	topicMap    map[string]string
	template    string
	// keyHeader: the new channel is RabbitMQ, whose messages carry no key:
	// a record's key travels in the outbox.HeaderAggregateID header, as
	// Ferry's relay writes it, when the record has none.
	keyHeader bool
}

// copyOf returns the copy of r under step, and whether its id was derived
// from the payload. ok is false when the step writes nothing to the new
// channel (OLD_ONLY).
//
// The copy has r's key, value, timestamp and headers, with two changes:
// the id travels in one outbox.HeaderID header, and the route stamp
// (route.HeaderRoute) is the bridge's, in place of any the record
// carried. A record whose outbox.HeaderID appears more than once is
// ambiguous: with IDFromHeader and the default header it is copied with
// its ids as they are, so the new channel's workers refuse it as the old
// channel's do.
func (c *copier) copyOf(r *kgo.Record, step route.Step) (out *kgo.Record, derived, ok bool) {
	role, ok := newRole(step, r.Key)
	if !ok {
		return nil, false, false
	}
	id, keepIDs := c.id(r.Headers)
	if id == nil && !keepIDs {
		id, derived = []byte(payloadid.Of(r.Key, r.Value)), true
	}
	headers := make([]kgo.RecordHeader, 0, len(r.Headers)+2)
	for _, h := range r.Headers {
		if h.Key == route.HeaderRoute || (h.Key == outbox.HeaderID && !keepIDs) {
			continue
		}
		headers = append(headers, h)
	}
	if !keepIDs {
		headers = append(headers, kgo.RecordHeader{Key: outbox.HeaderID, Value: id})
	}
	if c.keyHeader && len(r.Key) > 0 && !hasHeader(r.Headers, outbox.HeaderAggregateID) {
		headers = append(headers, kgo.RecordHeader{Key: outbox.HeaderAggregateID, Value: r.Key})
	}
	// Since and Peer stay empty: the bridge writes no fences (see the
	// package doc).
	stamp := route.Stamp{Plan: c.plan, Epoch: step.Epoch, Slice: route.Slice(r.Key), Side: migration.NewSide, Role: role}
	headers = append(headers, kgo.RecordHeader{Key: route.HeaderRoute, Value: stamp.Bytes()})
	return &kgo.Record{
		Topic:     newTopic(c.topicMap, c.template, r.Topic),
		Key:       r.Key,
		Value:     r.Value,
		Headers:   headers,
		Timestamp: r.Timestamp,
	}, derived, true
}

// id returns the record's id from its headers, nil when it must be
// derived; keep reports that the record's own outbox.HeaderID headers say
// it already (or are ambiguous) and are copied as they are.
func (c *copier) id(headers []kgo.RecordHeader) (id []byte, keep bool) {
	if c.fromPayload {
		return nil, false
	}
	n := 0
	for _, h := range headers {
		if h.Key == c.idHeader && id == nil && len(h.Value) > 0 {
			id = h.Value
		}
		if h.Key == outbox.HeaderID {
			n++
		}
	}
	if c.idHeader != outbox.HeaderID {
		return id, false
	}
	if n > 1 {
		return nil, true // ambiguous: see copyOf
	}
	return id, id != nil
}

// newRole is the role of the new channel's copy of an event of
// aggregateID under step; false when the step writes no such copy. A
// bridged copy is always authoritative: see the package doc.
func newRole(step route.Step, aggregateID []byte) (route.Role, bool) {
	for _, c := range step.Route(aggregateID) {
		if c.Side == migration.NewSide {
			return route.Authoritative, true
		}
	}
	return "", false
}

func hasHeader(headers []kgo.RecordHeader, key string) bool {
	for _, h := range headers {
		if h.Key == key {
			return true
		}
	}
	return false
}
