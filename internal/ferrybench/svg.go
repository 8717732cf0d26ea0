package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
)

// chart is a line chart of one sweep: the swept values on the x axis (on a
// log scale when the sweep is geometric) and one or more series of
// measurements. A series marked right is drawn against an axis of its own
// on the right, for a second unit; the others share the left axis.
type chart struct {
	title  string
	xLabel string
	logX   bool
	xs     []float64
	xTick  func(float64) string // an x value's tick label
	series []series
}

type series struct {
	name  string
	unit  string // the label of its y axis
	ys    []float64
	right bool
}

// The canvas and the margins around the plot area, in SVG user units.
const (
	chartW, chartH                       = 640.0, 360.0
	padLeft, padRight, padTop, padBottom = 76.0, 76.0, 56.0, 56.0
	// xInset keeps the first and last points off the axes, as a share of
	// the plot area's width.
	xInset = 0.05
)

var seriesColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd"}

// plotArea is the rectangle the series are drawn in: x0 left, x1 right,
// y0 top, y1 bottom (SVG's y grows downwards).
type plotArea struct{ x0, y0, x1, y1 float64 }

func (c chart) area() plotArea {
	return plotArea{padLeft, padTop, chartW - padRight, chartH - padBottom}
}

// xPos is where x sits across the plot area: evenly spaced steps of a
// geometric sweep on a log scale, proportional on a linear one.
func (c chart) xPos(x float64) float64 {
	a := c.area()
	lo, hi := slicesMinMax(c.xs)
	f := 0.5
	if hi > lo {
		if c.logX {
			f = (math.Log(x) - math.Log(lo)) / (math.Log(hi) - math.Log(lo))
		} else {
			f = (x - lo) / (hi - lo)
		}
	}
	w := a.x1 - a.x0
	return a.x0 + w*xInset + f*w*(1-2*xInset)
}

// yScale is a linear y axis from zero to top, labelled at its ticks.
type yScale struct {
	top   float64
	ticks []float64
}

// niceScale covers 0..maxY with about five ticks at round steps (1, 2, 2.5
// or 5 times a power of ten).
func niceScale(maxY float64) yScale {
	if !(maxY > 0) || math.IsInf(maxY, 0) {
		maxY = 1
	}
	raw := maxY / 5
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * pow
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*pow >= raw {
			step = m * pow
			break
		}
	}
	s := yScale{top: math.Ceil(maxY/step-1e-9) * step}
	for i := 0; float64(i)*step <= s.top+step/1e6; i++ {
		s.ticks = append(s.ticks, float64(i)*step)
	}
	return s
}

func (a plotArea) yPos(s yScale, y float64) float64 {
	return a.y1 - (a.y1-a.y0)*y/s.top
}

// scales returns the left axis's scale and the right axis's (nil when no
// series is on the right).
func (c chart) scales() (left yScale, right *yScale) {
	var maxL, maxR float64
	hasRight := false
	for _, s := range c.series {
		_, hi := slicesMinMax(s.ys)
		if s.right {
			maxR, hasRight = max(maxR, hi), true
		} else {
			maxL = max(maxL, hi)
		}
	}
	left = niceScale(maxL)
	if hasRight {
		r := niceScale(maxR)
		right = &r
	}
	return left, right
}

// slicesMinMax ignores NaN (a point that was not measured).
func slicesMinMax(xs []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, x := range xs {
		if !math.IsNaN(x) {
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	if lo > hi {
		return 0, 0
	}
	return lo, hi
}

// compact prints an axis value in at most three significant digits, with k
// and M for thousands and millions.
func compact(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// svg renders the chart as a standalone SVG document.
func (c chart) svg() []byte {
	var b bytes.Buffer
	a := c.area()
	left, right := c.scales()
	text := func(x, y float64, anchor, attrs, s string) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="%s"%s>`, x, y, anchor, attrs)
		_ = xml.EscapeText(&b, []byte(s))
		b.WriteString("</text>\n")
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n",
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="%.0f" height="%.0f" fill="#ffffff"/>`+"\n", chartW, chartH)
	text(chartW/2, 22, "middle", ` font-size="15" font-weight="bold"`, c.title)

	// Horizontal grid lines at the left axis's ticks, labelled on the left.
	for _, t := range left.ticks {
		y := a.yPos(left, t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e0e0e0"/>`+"\n", a.x0, y, a.x1, y)
		text(a.x0-6, y+4, "end", "", compact(t))
	}
	if right != nil {
		for _, t := range right.ticks {
			y := a.yPos(*right, t)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000000"/>`+"\n", a.x1, y, a.x1+4, y)
			text(a.x1+6, y+4, "start", "", compact(t))
		}
	}
	// The axes.
	fmt.Fprintf(&b, `<path d="M%.1f %.1fV%.1fH%.1f" fill="none" stroke="#000000"/>`+"\n", a.x0, a.y0, a.y1, a.x1)
	if right != nil {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000000"/>`+"\n", a.x1, a.y0, a.x1, a.y1)
	}
	// x ticks at the swept values.
	for _, x := range c.xs {
		px := c.xPos(x)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000000"/>`+"\n", px, a.y1, px, a.y1+4)
		label := compact(x)
		if c.xTick != nil {
			label = c.xTick(x)
		}
		text(px, a.y1+18, "middle", "", label)
	}
	xl := c.xLabel
	if c.logX {
		xl += ", log scale"
	}
	text((a.x0+a.x1)/2, chartH-14, "middle", "", xl)

	// Axis titles: the unit of the first series on each side, in its
	// colour when both sides are used.
	for i, s := range c.series {
		if s.right {
			continue
		}
		attrs := ""
		if right != nil {
			attrs = fmt.Sprintf(` fill="%s"`, seriesColors[i%len(seriesColors)])
		}
		y := (a.y0 + a.y1) / 2
		text(0, 0, "middle", fmt.Sprintf(` transform="translate(%.1f %.1f) rotate(-90)"%s`, 18.0, y, attrs), s.unit)
		break
	}
	for i, s := range c.series {
		if !s.right {
			continue
		}
		y := (a.y0 + a.y1) / 2
		text(0, 0, "middle", fmt.Sprintf(` transform="translate(%.1f %.1f) rotate(90)" fill="%s"`, chartW-14, y, seriesColors[i%len(seriesColors)]), s.unit)
		break
	}

	// The series, and a legend above the plot area.
	lx := a.x0
	for i, s := range c.series {
		color := seriesColors[i%len(seriesColors)]
		sc := left
		if s.right && right != nil {
			sc = *right
		}
		var pts bytes.Buffer
		for j, y := range s.ys {
			if j >= len(c.xs) || math.IsNaN(y) {
				continue
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", c.xPos(c.xs[j]), a.yPos(sc, y))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, bytes.TrimSpace(pts.Bytes()))
		for j, y := range s.ys {
			if j >= len(c.xs) || math.IsNaN(y) {
				continue
			}
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>`, c.xPos(c.xs[j]), a.yPos(sc, y), color)
			_ = xml.EscapeText(&b, []byte(fmt.Sprintf("%s: %s %s", s.name, strconv.FormatFloat(y, 'g', 4, 64), s.unit)))
			b.WriteString("</title></circle>\n")
		}
		name := s.name
		if right != nil {
			side := "left axis"
			if s.right {
				side = "right axis"
			}
			name += " (" + side + ")"
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="14" height="4" fill="%s"/>`+"\n", lx, a.y0-16, color)
		text(lx+18, a.y0-11, "start", "", name)
		lx += 18 + 7*float64(len(name)) + 24
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}
