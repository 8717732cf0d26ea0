package main

import (
	"strings"
	"testing"
)

// The shapes table gives each shape's drain against the walsender's own
// bound (its share on a core) and against the discarding client, paired
// per round, and for one event per transaction how far the rounds strayed
// from their median.
func TestShapesMarkdownPairsTheRatiosAndBoundsTheSpread(t *testing.T) {
	t.Parallel()
	rs := []*shapeResult{
		{perTx: 1, walsender: samples{100, 200, 100}, relay: samples{90, 100, 80}, ratio: samples{0.9, 0.5, 0.8},
			own: samples{0.92, 0.88, 0.95}, noCore: samples{0.05, 0.1, 0.04}, neither: samples{0.03, 0.02, 0.01},
			relayCost: samples{10, 11, 12}, relayBusy: samples{.5, .5, .5}},
		{perTx: 100, walsender: samples{1000}, relay: samples{950}, ratio: samples{0.95}, own: samples{0.8}, noCore: samples{0.1}, neither: samples{0.1},
			relayCost: samples{3}, relayBusy: samples{.4}},
	}
	md := shapesMarkdown(shapesOpts{events: 1000, payload: 200, runs: 3, onePerTx: 7, shapes: []int{1, 100}}, rs)
	for _, want := range []string{
		"median (min–max) of 3 rounds (7 of one event per transaction)",
		"| 1 | 90 (80–100) | **0.92 (0.88–0.95)** | 5 (4–10) / 2 (1–3)% | 11.0 (10.0–12.0) µs | 0.50 (0.50–0.50) | 100 (100–200) | 0.80 (0.50–0.90) |",
		"| 100 | 950 | **0.80** | 10 / 10% | 3.0 µs | 0.40 | 1000 | 0.95 |",
		"80 to 100 events/s, every round within 11% of the median (90)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in:\n%s", want, md)
		}
	}
}

// One event per transaction is drained at least -one-per-tx-runs times
// (the slow-state check wants 7 in a row), every other shape -runs times.
func TestShapesRoundsOfOneEventPerTransaction(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		runs, onePerTx, perTx, want int
	}{
		{3, 7, 1, 7}, {3, 7, 10, 3}, {3, 0, 1, 3}, {9, 7, 1, 9},
	} {
		if got := (shapesOpts{runs: c.runs, onePerTx: c.onePerTx}).rounds(c.perTx); got != c.want {
			t.Errorf("runs %d, one-per-tx-runs %d: %d events per transaction drained %d times, want %d", c.runs, c.onePerTx, c.perTx, got, c.want)
		}
	}
	md := shapesMarkdown(shapesOpts{events: 10, payload: 1, runs: 3, onePerTx: 7, shapes: []int{10}}, nil)
	if !strings.Contains(md, "median (min–max) of 3 rounds\n") {
		t.Errorf("without one event per transaction the header names 3 rounds only:\n%s", md)
	}
}
