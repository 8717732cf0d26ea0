package main

import (
	"strings"
	"testing"
)

func TestKneeIsTheFirstPointNoLaterPointBeatsByMoreThanTheTolerance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ys   []float64
		dir  int
		want int
	}{
		{[]float64{100, 200, 400, 420, 430}, +1, 2},            // nothing beats 400 by 10%
		{[]float64{100, 200, 400, 800}, +1, -1},                // never flattens
		{[]float64{100, 105, 108}, +1, 0},                      // flat from the start
		{[]float64{100, 105, 300}, +1, -1},                     // a late jump is no bend
		{[]float64{3242, 3836, 3087, 4431, 3096, 3015}, +1, 3}, // a dip at 3087 is not the knee
		{[]float64{100, 50, 25, 24, 23}, -1, 2},                // stops falling at 25
		{[]float64{100, 300, 200}, +1, 1},                      // a fall is not a gain
	} {
		if got := knee(c.ys, c.dir, 0.10); got != c.want {
			t.Errorf("knee(%v, %d) = %d, want %d", c.ys, c.dir, got, c.want)
		}
	}
}

func TestFirstMoveIsWhereAFlatCurveStartsMovingMoreThanTheTolerance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ys   []float64
		dir  int
		want int
	}{
		{[]float64{10, 10.5, 11, 30, 90}, +1, 2},
		{[]float64{10, 10.5, 11}, +1, -1},
		{[]float64{80, 78, 60, 20}, -1, 1},
		{[]float64{80, 100, 120}, -1, -1},
	} {
		if got := firstMove(c.ys, c.dir, 0.10); got != c.want {
			t.Errorf("firstMove(%v, %d) = %d, want %d", c.ys, c.dir, got, c.want)
		}
	}
}

func TestKneeSentenceNamesTheKneeAndAFallAfterThePeak(t *testing.T) {
	t.Parallel()
	xs := []float64{1, 2, 4, 8, 16}
	s := kneeSentence("Throughput", []float64{1000, 2000, 3000, 3100, 2000}, xs, count, msgs)
	for _, want := range []string{"rises up to 4 (3,000 msg/s, 3.0x", "peaks at 8 (3,100 msg/s) and falls to 2,000 msg/s at 16"} {
		if !strings.Contains(s, want) {
			t.Errorf("%q does not say %q", s, want)
		}
	}
	if s := kneeSentence("Throughput", []float64{1, 2, 4, 8, 16}, xs, count, msgs); !strings.Contains(s, "no bend in this range") {
		t.Errorf("a curve that keeps rising: %q", s)
	}
}

func TestHoldsSentenceSaysWhereAFlatCurveStartsFalling(t *testing.T) {
	t.Parallel()
	xs := []float64{1, 10, 100, 1000}
	topics := counts("topic", "topics")
	for _, c := range []struct {
		ys   []float64
		want string
	}{
		{[]float64{100, 95, 40, 10}, "holds within 10% per step up to 10 topics (95 events/s) and falls from there, to 10 events/s at 1,000 topics"},
		{[]float64{100, 50, 40, 10}, "falls by more than 10% from the first step on: 100 events/s at 1 topic, 50 events/s at 10 topics"},
		{[]float64{100, 95, 90, 85}, "holds within 10% per step across the range"},
	} {
		if s := holdsSentence("The drain rate", c.ys, xs, topics, counted("events/s")); !strings.Contains(s, c.want) {
			t.Errorf("%v: %q does not say %q", c.ys, s, c.want)
		}
	}
}

func TestCountAndBytesLabels(t *testing.T) {
	t.Parallel()
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 81759.4: "81,759", 1_000_000: "1,000,000", -12345: "-12,345"} {
		if got := count(v); got != want {
			t.Errorf("count(%g) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]string{100: "100 B", 1024: "1 KiB", 16384: "16 KiB", 262144: "256 KiB", 1_048_588: "1 MiB"} {
		if got := bytesLabel(v); got != want {
			t.Errorf("bytesLabel(%g) = %q, want %q", v, got, want)
		}
	}
}

func TestCurveMarkdownLinksItsChartNextToItsTable(t *testing.T) {
	t.Parallel()
	c := &curve{name: "relay-payload", heading: "Relay: payload size", setup: "setup", columns: []string{"payload", "events/s"},
		rows: [][]string{{"100 B", "64,020"}, {"1 KiB", "27,060"}}, chart: chart{title: "Relay drain against payload"},
		bends: []string{"It bends."}, why: "because."}
	md := c.markdown(curveOpts{charts: "docs/bench", link: "bench"})
	for _, want := range []string{
		"![Relay drain against payload](bench/relay-payload.svg)\n\n| payload | events/s |\n|---|---|\n| 100 B | 64,020 |\n| 1 KiB | 27,060 |\n",
		"Where it bends: It bends.", "Why: because.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown does not hold %q:\n%s", want, md)
		}
	}
	if md := c.markdown(curveOpts{}); strings.Contains(md, "![") {
		t.Errorf("a chart linked although none was written:\n%s", md)
	}
}
