package stats

import "testing"

func TestFormatShowsMedianAndRange(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s    Samples
		want string
	}{
		{Samples{90, 110, 100}, "100 (90–110)"},
		{Samples{7}, "7"},
		{nil, "0"},
		{Samples{1, 2, 3, 4}, "3 (1–4)"},
	} {
		if got := c.s.Format("%.0f"); got != c.want {
			t.Errorf("%v.Format = %q, want %q", c.s, got, c.want)
		}
	}
}

// Paired ratios follow the pairs, not the medians: both sides slow down
// together in the second pair.
func TestRatiosArePaired(t *testing.T) {
	t.Parallel()
	r := Ratios(Samples{95, 50, 98}, Samples{100, 50, 100})
	if got := r.Range("%.2f"); got != "0.95–1.00" {
		t.Errorf("range of the ratios = %q", got)
	}
	if got := Ratios(Samples{1, 2}, Samples{0, 4}); len(got) != 1 || got[0] != 0.5 {
		t.Errorf("a zero denominator is left out: %v", got)
	}
}
