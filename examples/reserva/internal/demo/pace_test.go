package demo

import (
	"testing"
	"time"
)

func TestPaceOnScheduleIsNotBehind(t *testing.T) {
	t.Parallel()
	var p pace
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	p.begin(start, 10*time.Millisecond)
	for i := range 100 {
		p.send(i, start.Add(time.Duration(i+1)*10*time.Millisecond+time.Millisecond))
	}
	if b := p.behind(); b != time.Millisecond {
		t.Errorf("behind %s, want 1ms", b)
	}
	if r := p.rate(); r < 99 || r > 100 {
		t.Errorf("rate %.1f, want about 100 a second", r)
	}
}

func TestPaceStaysBehindAfterAStall(t *testing.T) {
	t.Parallel()
	var p pace
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	p.begin(start, 10*time.Millisecond)
	p.send(0, start.Add(10*time.Millisecond))
	// Every client waited for the API for half a second; the ticker dropped
	// the ticks it missed, so the later orders keep the delay.
	for i := 1; i < 50; i++ {
		p.send(i, start.Add(time.Duration(i+1)*10*time.Millisecond+500*time.Millisecond))
	}
	if b := p.behind(); b != 500*time.Millisecond {
		t.Errorf("behind %s, want 500ms", b)
	}
	if r := p.rate(); r > 50 {
		t.Errorf("rate %.1f, want the sag to show (50 orders in 1s)", r)
	}
}
