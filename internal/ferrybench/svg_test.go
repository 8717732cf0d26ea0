package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strconv"
	"testing"
)

func testChart() chart {
	return chart{
		title: "drain <rate> & cost", xLabel: "payload", logX: true,
		xs:    []float64{100, 1024, 16384, 65536, 262144},
		xTick: bytesLabel,
		series: []series{
			{name: "drain", unit: "events/s", ys: []float64{80000, 60000, math.NaN(), 3000, 900}},
			{name: "CPU", unit: "µs/event", ys: []float64{5, 9, 40, 120, 400}, right: true},
		},
	}
}

// svgElements parses doc as XML, failing the test on any syntax error, and
// returns the start elements by name.
func svgElements(t *testing.T, doc []byte) map[string][]xml.StartElement {
	t.Helper()
	out := map[string][]xml.StartElement{}
	d := xml.NewDecoder(bytes.NewReader(doc))
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, doc)
		}
		if se, ok := tok.(xml.StartElement); ok {
			out[se.Name.Local] = append(out[se.Name.Local], se)
		}
	}
}

func attr(t *testing.T, se xml.StartElement, name string) float64 {
	t.Helper()
	for _, a := range se.Attr {
		if a.Name.Local == name {
			v, err := strconv.ParseFloat(a.Value, 64)
			if err != nil {
				t.Fatalf("%s=%q: %v", name, a.Value, err)
			}
			return v
		}
	}
	t.Fatalf("<%s> has no %s", se.Name.Local, name)
	return 0
}

func TestChartSVGIsWellFormedXML(t *testing.T) {
	t.Parallel()
	els := svgElements(t, testChart().svg())
	if len(els["svg"]) != 1 {
		t.Fatalf("%d <svg> elements, want 1", len(els["svg"]))
	}
	if got := len(els["polyline"]); got != 2 {
		t.Errorf("%d polylines, want one per series (2)", got)
	}
}

func TestChartPointsLieInsideThePlotArea(t *testing.T) {
	t.Parallel()
	c := testChart()
	a := c.area()
	circles := svgElements(t, c.svg())["circle"]
	if len(circles) != 9 { // 10 values, one of them NaN: not drawn
		t.Fatalf("%d points drawn, want 9", len(circles))
	}
	for _, p := range circles {
		x, y := attr(t, p, "cx"), attr(t, p, "cy")
		if x < a.x0 || x > a.x1 || y < a.y0 || y > a.y1 {
			t.Errorf("point (%.1f, %.1f) outside the plot area %+v", x, y, a)
		}
	}
}

func TestChartRightSeriesUsesItsOwnScale(t *testing.T) {
	t.Parallel()
	c := testChart()
	left, right := c.scales()
	if right == nil {
		t.Fatal("no right axis for a series marked right")
	}
	if left.top < 80000 || right.top < 400 || right.top >= 1000 {
		t.Errorf("left axis to %g, right to %g: want each to cover its own series' maximum, and only about that", left.top, right.top)
	}
}

func TestLogScaleIsMonotonicAndEvenOverAGeometricSweep(t *testing.T) {
	t.Parallel()
	c := chart{logX: true, xs: []float64{1, 10, 100, 1000, 10000, 100000}}
	var prev, step float64
	for i, x := range c.xs {
		p := c.xPos(x)
		if i > 0 {
			if p <= prev {
				t.Fatalf("xPos(%g) = %.2f, not right of the previous point (%.2f)", x, p, prev)
			}
			if i > 1 && math.Abs((p-prev)-step) > 1e-9 {
				t.Errorf("step to %g is %.3f, previous steps %.3f: a geometric sweep is not evenly spaced", x, p-prev, step)
			}
			step = p - prev
		}
		prev = p
	}
	a := c.area()
	if first, last := c.xPos(1), c.xPos(100000); first <= a.x0 || last >= a.x1 {
		t.Errorf("end points at %.1f and %.1f, want inside (%.1f, %.1f)", first, last, a.x0, a.x1)
	}
}

func TestNiceScaleCoversTheMaximumWithRoundTicks(t *testing.T) {
	t.Parallel()
	for _, maxY := range []float64{0.37, 1, 7, 123, 4999, 81759, 2.1e6} {
		s := niceScale(maxY)
		if s.top < maxY || s.top > 2*maxY {
			t.Errorf("niceScale(%g).top = %g, want in [max, 2*max]", maxY, s.top)
		}
		if n := len(s.ticks); n < 3 || n > 11 || s.ticks[0] != 0 || math.Abs(s.ticks[n-1]-s.top) > s.top*1e-9 {
			t.Errorf("niceScale(%g).ticks = %v, want 0 to top in 3 to 11 steps", maxY, s.ticks)
		}
	}
}
