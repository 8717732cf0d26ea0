package backoff_test

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/backoff"
)

// Each step of the curve stays within [d/2, d], d doubling from base up to
// the ceiling and never beyond.
func TestDelayBoundsEachStep(t *testing.T) {
	t.Parallel()
	base, ceiling := 100*time.Millisecond, 3*time.Second
	want := []time.Duration{ // d for n = 1, 2, ...
		100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3 * time.Second, 3 * time.Second, 3 * time.Second,
	}
	for i, d := range want {
		n := i + 1
		for range 200 {
			got := backoff.Delay(n, base, ceiling)
			if got < d/2 || got > d {
				t.Fatalf("Delay(%d, %s, %s) = %s, want within [%s, %s]", n, base, ceiling, got, d/2, d)
			}
		}
	}
	for _, n := range []int{50, 1000, 1 << 30} {
		if got := backoff.Delay(n, base, ceiling); got < ceiling/2 || got > ceiling {
			t.Fatalf("Delay(%d) = %s, want within [%s, %s]: the ceiling holds however many failures", n, got, ceiling/2, ceiling)
		}
	}
}

// A base above the ceiling is capped from the first failure on.
func TestDelayCapsTheBase(t *testing.T) {
	t.Parallel()
	for range 200 {
		if got := backoff.Delay(1, time.Minute, time.Second); got < time.Second/2 || got > time.Second {
			t.Fatalf("Delay(1, 1m, 1s) = %s, want within [500ms, 1s]", got)
		}
	}
	if got := backoff.Delay(3, 0, time.Second) + backoff.Delay(3, time.Second, 0); got != 0 {
		t.Fatalf("Delay with a zero base or ceiling = %s, want 0", got)
	}
}

// The jitter really spreads the waits over the lower half: many draws reach
// near both ends of [d/2, d] and are not all equal.
func TestDelayJitterSpreads(t *testing.T) {
	t.Parallel()
	d := time.Second
	lo, hi := d, time.Duration(0)
	for range 2000 {
		got := backoff.Delay(1, d, d)
		lo, hi = min(lo, got), max(hi, got)
	}
	if lo > d*6/10 || hi < d*9/10 {
		t.Fatalf("2000 waits span [%s, %s]: want jitter across [%s, %s]", lo, hi, d/2, d)
	}
}

// A Sequence follows Delay's curve failure by failure and starts over after
// Reset.
func TestSequenceFollowsTheCurveAndResets(t *testing.T) {
	t.Parallel()
	s := backoff.Sequence{Base: 250 * time.Millisecond, Ceiling: time.Second}
	for _, d := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, time.Second} {
		if got := s.Next(); got < d/2 || got > d {
			t.Fatalf("Next = %s, want within [%s, %s]", got, d/2, d)
		}
	}
	s.Reset()
	if got := s.Next(); got < 125*time.Millisecond || got > 250*time.Millisecond {
		t.Fatalf("Next after Reset = %s, want within [125ms, 250ms]", got)
	}
}
