package main

import (
	"fmt"
	"slices"
)

// samples are the measurements of one figure, in the order they were taken.
// A figure is reported as its median and its range, never as one number: a
// ratio whose margin is smaller than the run-to-run swing proves nothing.
type samples []float64

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func (s samples) median() float64 { return median(s) }

func (s samples) min() float64 {
	if len(s) == 0 {
		return 0
	}
	return slices.Min(s)
}

func (s samples) max() float64 {
	if len(s) == 0 {
		return 0
	}
	return slices.Max(s)
}

// format prints "median (min–max)" with the given verb, e.g. "%.0f".
func (s samples) format(verb string) string {
	if len(s) < 2 {
		return fmt.Sprintf(verb, s.median())
	}
	return fmt.Sprintf(verb+" ("+verb+"–"+verb+")", s.median(), s.min(), s.max())
}

// ratios pairs a[i] with b[i], samples taken next to each other: their
// spread is the spread of the ratio, which the spreads of a and b apart
// overstate when both move with the machine's load.
func ratios(a, b samples) samples {
	out := make(samples, 0, min(len(a), len(b)))
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}
