// Package topicname holds Kafka's rules for a topic's name and the one
// check of an event topic template ("outbox.event.{aggregate_type}"),
// wherever the template comes from: relay.Config.TopicTemplate and each
// channel of a migration plan (migration.Channel.TopicTemplate).
package topicname

import (
	"fmt"
	"regexp"
	"strings"
)

// DeadLetterSuffix ends the workers' dead-letter topics (the default of
// inbox.DeadLetterSuffixDefault). The relay never writes into one: an
// event there would pose as a dead letter that a redrive trusts.
const DeadLetterSuffix = ".dlq"

// The placeholders of an event topic template.
const (
	AggregateType = "{aggregate_type}"
	EventType     = "{event_type}"
)

var placeholder = regexp.MustCompile(`\{[^{}]*\}`)

// CheckTemplate returns why tmpl cannot name the topics of events, nil
// when it can: only AggregateType and EventType may stand in braces, and
// the rest must be a valid Kafka topic name that is no dead-letter topic.
// The error starts with the quoted template, for the caller to prefix
// with the setting: `relay: Config.TopicTemplate "outbox.{foo}": unknown
// placeholder {foo} (use {aggregate_type} or {event_type})`.
func CheckTemplate(tmpl string) error {
	for _, p := range placeholder.FindAllString(tmpl, -1) {
		if p != AggregateType && p != EventType {
			return fmt.Errorf("%q: unknown placeholder %s (use %s or %s)", tmpl, p, AggregateType, EventType)
		}
	}
	fixed := strings.NewReplacer(AggregateType, "a", EventType, "e").Replace(tmpl)
	if strings.ContainsAny(fixed, "{}") {
		return fmt.Errorf("%q: a brace outside %s and %s (unclosed, or one too many)", tmpl, AggregateType, EventType)
	}
	if !Valid(fixed) {
		return fmt.Errorf("%q: the fixed part must be a valid Kafka topic name (letters, digits, '.', '_', '-')", tmpl)
	}
	if strings.HasSuffix(tmpl, DeadLetterSuffix) {
		return fmt.Errorf("%q names dead-letter topics (ending in %s): the relay never writes into them", tmpl, DeadLetterSuffix)
	}
	return nil
}

// Valid applies Kafka's topic name rules: 1 to 249 letters, digits, '.',
// '_' and '-', and neither "." nor "..".
func Valid(s string) bool {
	if s == "" || len(s) > 249 || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Fill is the topic tmpl names for an event of aggregateType and
// eventType.
func Fill(tmpl, aggregateType, eventType string) string {
	return strings.NewReplacer(AggregateType, aggregateType, EventType, eventType).Replace(tmpl)
}

// Pattern reads a template backwards: the aggregate and event types of a
// topic it named.
type Pattern struct {
	tmpl     string
	re       *regexp.Regexp
	agg, evt int // the groups' indexes in re; 0 when tmpl lacks the placeholder
}

// NewPattern is the pattern of tmpl, a template CheckTemplate accepts.
func NewPattern(tmpl string) *Pattern {
	pat := regexp.QuoteMeta(tmpl)
	pat = strings.Replace(pat, regexp.QuoteMeta(AggregateType), "(?P<agg>.+?)", 1)
	pat = strings.Replace(pat, regexp.QuoteMeta(EventType), "(?P<evt>.+?)", 1)
	re := regexp.MustCompile("^" + pat + "$")
	return &Pattern{tmpl: tmpl, re: re, agg: max(re.SubexpIndex("agg"), 0), evt: max(re.SubexpIndex("evt"), 0)}
}

// Parse returns the aggregate and event types whose topic is topic; false
// when the template cannot have named it, names dead-letter topics' names
// (never an event's), or names it in more than one way. A placeholder the
// template lacks is returned empty.
func (p *Pattern) Parse(topic string) (aggregateType, eventType string, ok bool) {
	if strings.HasSuffix(topic, DeadLetterSuffix) || strings.HasPrefix(topic, "__") {
		return "", "", false
	}
	m := p.re.FindStringSubmatch(topic)
	if m == nil {
		return "", "", false
	}
	if p.agg > 0 {
		aggregateType = m[p.agg]
	}
	if p.evt > 0 {
		eventType = m[p.evt]
	}
	if Fill(p.tmpl, aggregateType, eventType) != topic { // a placeholder used twice, or an ambiguous split
		return "", "", false
	}
	return aggregateType, eventType, true
}

// Uses reports whether the template has the placeholder (AggregateType
// or EventType).
func (p *Pattern) Uses(placeholder string) bool {
	return strings.Contains(p.tmpl, placeholder)
}
