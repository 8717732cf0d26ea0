package main

import "github.com/ferryhq/ferry/internal/stats"

// samples are the measurements of one figure: see stats.Samples.
type samples = stats.Samples

// median is the middle of xs (the upper one of an even count).
func median(xs []float64) float64 { return stats.Samples(xs).Median() }
