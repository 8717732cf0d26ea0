package relaycli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/migration"
)

// On a RabbitMQ old channel, status says of each group how long ago it
// last took a message to apply there, beside the quiet the drain wants.
func TestReportTableShowsTheOldChannelsQuiet(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	lateness, age, dead := 10*time.Second, time.Minute, 0
	gate := gateFlags{maxLateness: &lateness, maxAge: &age, maxDeadLetters: &dead}
	reports := map[string]migration.Report{
		"stock":   {Group: "stock", At: now, OldWorkedAt: now.Add(-3 * time.Second), OldQuiet: 90 * time.Second},
		"billing": {Group: "billing", At: now, OldQuiet: 90 * time.Second},
	}
	for _, c := range []struct {
		kind migration.Kind
		want []string
	}{
		{migration.RabbitMQ, []string{"stock: last took a message to apply from the old channel 3s before its report (the drain wants 1m30s of quiet)",
			"billing: nothing to apply from the old channel since its worker started (the drain wants 1m30s of quiet)"}},
		{migration.Kafka, nil},
	} {
		var out bytes.Buffer
		p := migration.Plan{Name: "move", Old: migration.Channel{Kind: c.kind}, Groups: []string{"stock", "billing"}}
		if err := reportTable(&out, p, reports, gate, false, now); err != nil {
			t.Fatal(err)
		}
		for _, line := range c.want {
			if !strings.Contains(out.String(), line) {
				t.Errorf("%s old channel: status lacks %q:\n%s", c.kind, line, out.String())
			}
		}
		if c.want == nil && strings.Contains(out.String(), "quiet") {
			t.Errorf("a Kafka old channel's status speaks of quiet:\n%s", out.String())
		}
	}
}

// The lag on a RabbitMQ channel comes from the groups' reports, on either
// side; a group whose report has none shows "?" and a line says why.
func TestLagTableReadsRabbitMQLagsFromTheReports(t *testing.T) {
	seven, three := int64(7), int64(3)
	reports := map[string]migration.Report{"stock": {OldLag: &seven, NewLag: &three}, "billing": {}}
	p := migration.Plan{Name: "move", Old: migration.Channel{Kind: migration.RabbitMQ}, New: migration.Channel{Kind: migration.RabbitMQ},
		Groups: []string{"stock", "billing"}}
	var out bytes.Buffer
	if err := lagTable(t.Context(), &out, p, reports); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"stock    7        3", "billing  ?        ?", "no report of billing gives its lag on RabbitMQ yet"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("lag table lacks %q:\n%s", want, out.String())
		}
	}
}
