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
