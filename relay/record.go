package relay

import (
	"encoding/json"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/topicname"
)

// topicNamer fills the topic template, remembering each name it made. It
// is used by one session goroutine at a time.
type topicNamer struct {
	template      string
	usesAggregate bool
	usesEvent     bool
	cache         map[string]namedTopic
	pattern       *topicname.Pattern // parse's, made on first use
}

type namedTopic struct {
	name    string
	problem string // why the relay will not write to it (topicProblem); "" when it may
}

func newTopicNamer(template string) *topicNamer {
	return &topicNamer{
		template:      template,
		usesAggregate: strings.Contains(template, "{aggregate_type}"),
		usesEvent:     strings.Contains(template, "{event_type}"),
		cache:         make(map[string]namedTopic),
	}
}

func (n *topicNamer) topic(r *row) namedTopic {
	var key string
	switch {
	case n.usesAggregate && n.usesEvent:
		key = string(r.AggregateType) + "\x00" + string(r.EventType)
	case n.usesAggregate:
		if t, ok := n.cache[string(r.AggregateType)]; ok { // no allocation on a hit
			return t
		}
		key = string(r.AggregateType)
	case n.usesEvent:
		if t, ok := n.cache[string(r.EventType)]; ok {
			return t
		}
		key = string(r.EventType)
	}
	if t, ok := n.cache[key]; ok {
		return t
	}
	name := n.template
	if n.usesAggregate {
		name = strings.ReplaceAll(name, "{aggregate_type}", string(r.AggregateType))
	}
	if n.usesEvent {
		name = strings.ReplaceAll(name, "{event_type}", string(r.EventType))
	}
	t := namedTopic{name: name, problem: topicProblem(name)}
	if len(n.cache) > 10_000 { // aggregate types are few; never grow without bound
		clear(n.cache)
	}
	n.cache[key] = t
	return t
}

// parse returns the row whose aggregate and event types name topic under
// the template (false when the template cannot have made it, or makes
// dead-letter topics' names: never a migration's topic).
func (n *topicNamer) parse(topic string) (*row, bool) {
	if n.pattern == nil {
		n.pattern = topicname.NewPattern(n.template)
	}
	agg, evt, ok := n.pattern.Parse(topic)
	if !ok {
		return nil, false
	}
	return &row{AggregateType: []byte(agg), EventType: []byte(evt)}, true
}

// covers reports whether every placeholder of this template is one o has
// too: then a topic of o names one of this template.
func (n *topicNamer) covers(o *topicNamer) bool {
	return (!n.usesAggregate || o.usesAggregate) && (!n.usesEvent || o.usesEvent)
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
		m[string(h.Key)] = string(h.Value)
	}
	b, _ := json.Marshal(m) // a map of strings always marshals
	return b
}
