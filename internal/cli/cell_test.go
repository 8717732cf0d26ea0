package cli

import (
	"strings"
	"testing"
)

// Cell passes printable text as it is, quotes text with control bytes or
// invalid UTF-8, and cuts long text on a rune boundary, saying how much.
func TestCellEscapesAndCuts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"order.placed", 40, "order.placed"},
		{"ünïcode ok", 40, "ünïcode ok"},
		{"\x1b]0;pwned\x07", 40, `"\x1b]0;pwned\a"`},
		{"a\tb\nc", 40, `"a\tb\nc"`},
		{"rtl\u202etxt", 40, `"rtl\u202etxt"`},
		{"bad\xffutf8", 40, `"bad\xffutf8"`},
		{"éééééé", 6, "éééééé"},
		{"éééééé", 4, "éééé...(4 more bytes)"},
		{strings.Repeat("x", 10_000), 4, "xxxx...(9996 more bytes)"},
	} {
		if got := Cell(c.in, c.max); got != c.want {
			t.Errorf("Cell(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}
