package cli

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Cell makes s, which may come from event data or message headers, safe for
// one cell of a table printed to a terminal. A terminal obeys the control
// and escape bytes it receives (ESC ] 0 ; title BEL retitles the window,
// ESC [ 2 J clears it, a newline or tab breaks the table, U+202E reverses
// the text after it), so when s holds any of those, or invalid UTF-8, it is
// shown quoted with Go's escapes ("\x1b]0;title\a"). A cell longer than max
// runes is cut, saying how much was left out: a 10 KB id must not stretch
// every row of the table.
func Cell(s string, max int) string {
	if !printable(s) {
		s = strconv.Quote(s)
	}
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	cut, n := 0, 0
	for i := range s {
		if n == max {
			cut = i
			break
		}
		n++
	}
	return fmt.Sprintf("%s...(%d more bytes)", s[:cut], len(s)-cut)
}

// printable reports whether s is valid UTF-8 with only printable runes and
// plain spaces.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return false
		}
	}
	return true
}
