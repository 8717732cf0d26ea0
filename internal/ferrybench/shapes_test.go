package main

import (
	"strings"
	"testing"
)

// The shapes table gives each shape's relay-to-bound ratio from the rounds'
// pairs, and for one event per transaction how far the rounds strayed from
// their median.
func TestShapesMarkdownPairsTheRatiosAndBoundsTheSpread(t *testing.T) {
	t.Parallel()
	rs := []*shapeResult{
		{perTx: 1, walsender: samples{100, 200, 100}, relay: samples{90, 100, 80}, ratio: samples{0.9, 0.5, 0.8},
			relayCost: samples{10, 11, 12}, relayBusy: samples{.5, .5, .5}},
		{perTx: 100, walsender: samples{1000}, relay: samples{950}, ratio: samples{0.95}, relayCost: samples{3}, relayBusy: samples{.4}},
	}
	md := shapesMarkdown(shapesOpts{events: 1000, payload: 200, runs: 3}, rs)
	for _, want := range []string{
		"| 1 | 100 (100–200) | 90 (80–100) | **0.80 (0.50–0.90)** |",
		"| 100 | 1000 | 950 | **0.95** |",
		"80 to 100 events/s, every round within 11% of the median (90)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in:\n%s", want, md)
		}
	}
}
