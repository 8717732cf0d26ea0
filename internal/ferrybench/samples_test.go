package main

import "testing"

func TestSamplesFormatAndPairedRatios(t *testing.T) {
	t.Parallel()
	s := samples{90, 110, 100}
	if got := s.format("%.0f"); got != "100 (90–110)" {
		t.Errorf("format = %q", got)
	}
	// Paired ratios follow the pairs, not the medians: both sides slow
	// down together in the second pair.
	r := ratios(samples{95, 50, 98}, samples{100, 50, 100})
	if got := rangeOf(r, "%.2f"); got != "0.95–1.00" {
		t.Errorf("range of the ratios = %q", got)
	}
}
