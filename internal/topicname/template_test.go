package topicname_test

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/topicname"
)

// CheckTemplate takes the templates that name valid topics, and refuses
// every other one with the reason, the template quoted first.
func TestCheckTemplate(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"outbox.event.{aggregate_type}", "{aggregate_type}.{event_type}", "fixed", "orders-v2_{event_type}"} {
		if err := topicname.CheckTemplate(ok); err != nil {
			t.Errorf("CheckTemplate(%q) = %v, want nil", ok, err)
		}
	}
	for tmpl, want := range map[string]string{
		"outbox.{foo}":                  "unknown placeholder {foo}",
		"outbox.{aggregate_type":        "a brace outside",
		"outbox}.{aggregate_type}}":     "a brace outside",
		"outbox.{{aggregate_type}}":     "a brace outside",
		"outbox event.{aggregate_type}": "valid Kafka topic name",
		"":                              "valid Kafka topic name",
		"..":                            "valid Kafka topic name",
		strings.Repeat("x", 250):        "valid Kafka topic name",
		"outbox.{aggregate_type}.dlq":   "dead-letter",
	} {
		err := topicname.CheckTemplate(tmpl)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), `"`) {
			t.Errorf("CheckTemplate(%q) = %v, want an error starting with the template and naming %q", tmpl, err, want)
		}
	}
}

// A pattern reads back the types Fill put in a topic, and refuses a topic
// the template did not name, a dead-letter topic, and an ambiguous split.
func TestPatternReadsBackWhatFillNamed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tmpl, topic string
		agg, evt    string
		ok          bool
	}{
		{"outbox.event.{aggregate_type}", "outbox.event.order", "order", "", true},
		{"o.{aggregate_type}.{event_type}", "o.order.placed", "order", "placed", true},
		{"{event_type}-v1", "placed-v1", "", "placed", true},
		{"outbox.event.{aggregate_type}", "other.order", "", "", false},
		{"outbox.{aggregate_type}", "outbox.order.dlq", "", "", false},
		{"fixed", "fixed", "", "", true},
	} {
		agg, evt, ok := topicname.NewPattern(tc.tmpl).Parse(tc.topic)
		if agg != tc.agg || evt != tc.evt || ok != tc.ok {
			t.Errorf("%s parses %s as (%q, %q, %v), want (%q, %q, %v)", tc.tmpl, tc.topic, agg, evt, ok, tc.agg, tc.evt, tc.ok)
		}
		if ok && topicname.Fill(tc.tmpl, agg, evt) != tc.topic {
			t.Errorf("%s fills (%q, %q) as %s, want %s", tc.tmpl, agg, evt, topicname.Fill(tc.tmpl, agg, evt), tc.topic)
		}
	}
}
