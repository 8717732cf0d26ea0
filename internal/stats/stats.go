// Package stats holds what the benchmarks report of repeated measurements:
// the median and the range, never one sample, and ratios taken pair by pair.
package stats

import (
	"fmt"
	"slices"
)

// Samples are the measurements of one figure, in the order they were taken.
// A figure is reported as its median and its range, never as one number: a
// ratio whose margin is smaller than the run-to-run swing proves nothing.
type Samples []float64

// Median is the middle sample (the upper one of an even count); 0 when
// there is none.
func (s Samples) Median() float64 {
	c := slices.Clone(s)
	slices.Sort(c)
	if len(c) == 0 {
		return 0
	}
	return c[len(c)/2]
}

// Min is the smallest sample; 0 when there is none.
func (s Samples) Min() float64 {
	if len(s) == 0 {
		return 0
	}
	return slices.Min(s)
}

// Max is the largest sample; 0 when there is none.
func (s Samples) Max() float64 {
	if len(s) == 0 {
		return 0
	}
	return slices.Max(s)
}

// Format prints "median (min–max)" with the given verb, e.g. "%.0f"; one
// sample prints alone.
func (s Samples) Format(verb string) string {
	if len(s) < 2 {
		return fmt.Sprintf(verb, s.Median())
	}
	return fmt.Sprintf(verb+" ("+verb+"–"+verb+")", s.Median(), s.Min(), s.Max())
}

// Range prints "min–max".
func (s Samples) Range(verb string) string {
	return fmt.Sprintf(verb+"–"+verb, s.Min(), s.Max())
}

// Ratios pairs a[i] with b[i], samples taken next to each other: their
// spread is the spread of the ratio, which the spreads of a and b apart
// overstate when both move with the machine's load. A pair whose b is not
// positive is left out.
func Ratios(a, b Samples) Samples {
	out := make(Samples, 0, min(len(a), len(b)))
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}
