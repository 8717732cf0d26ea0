package relay

import (
	"encoding/json"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Kafka headers set on every record.
const (
	HeaderID            = "id"
	HeaderEventType     = "event_type"
	HeaderAggregateType = "aggregate_type"
	HeaderAggregateID   = "aggregate_id"
)

// topicNamer fills the topic template.
type topicNamer struct {
	template      string
	usesAggregate bool
	usesEvent     bool
}

func newTopicNamer(template string) topicNamer {
	return topicNamer{
		template:      template,
		usesAggregate: strings.Contains(template, "{aggregate_type}"),
		usesEvent:     strings.Contains(template, "{event_type}"),
	}
}

func (n topicNamer) topic(r *row) string {
	t := n.template
	if n.usesAggregate {
		t = strings.ReplaceAll(t, "{aggregate_type}", r.AggregateType)
	}
	if n.usesEvent {
		t = strings.ReplaceAll(t, "{event_type}", r.EventType)
	}
	return t
}

// record maps an outbox row to a Kafka record: key = aggregate id, value =
// payload bytes unchanged, Ferry's headers then the row's own, timestamp =
// created_at.
func (n topicNamer) record(r *row) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, 4+len(r.Headers))
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderID, Value: []byte(r.ID.String())},
		kgo.RecordHeader{Key: HeaderEventType, Value: []byte(r.EventType)},
		kgo.RecordHeader{Key: HeaderAggregateType, Value: []byte(r.AggregateType)},
		kgo.RecordHeader{Key: HeaderAggregateID, Value: []byte(r.AggregateID)},
	)
	for _, h := range r.Headers {
		headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
	}
	return &kgo.Record{
		Topic:     n.topic(r),
		Key:       []byte(r.AggregateID),
		Value:     r.Payload,
		Headers:   headers,
		Timestamp: r.CreatedAt,
	}
}

// recordSize approximates a record's bytes for the in-flight budget.
func recordSize(rec *kgo.Record) int {
	n := len(rec.Key) + len(rec.Value) + 64
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// headersJSON renders a row's own headers as the JSON object stored in
// outbox_quarantine.headers.
func headersJSON(hs []header) []byte {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[h.Key] = h.Value
	}
	b, _ := json.Marshal(m) // a map of strings always marshals
	return b
}
