package replsock

import (
	"testing"
	"time"
)

// The wait after an emptied socket is the window at low rates, and at
// higher ones the time the stream takes to bring gatherBytes: what gathers
// stays far below a socket's buffer, and a fast backlog does not wait.
func TestReadWaitFollowsTheStreamsRate(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, c := range []struct {
		name     string
		gathered int
		elapsed  time.Duration
		want     time.Duration
	}{
		{"1,000 events/s of 400 bytes", 2_000, 5 * time.Millisecond, 5 * time.Millisecond},
		{"the first emptying", 0, 0, 5 * time.Millisecond},
		{"8 MB/s", 40_000, 5 * time.Millisecond, time.Duration(float64(5*time.Millisecond) * gatherBytes / 40_000)},
		{"a 50 MB/s backlog: a fraction of a millisecond", 8 << 10, 160 * time.Microsecond, 640 * time.Microsecond},
		{"500 MB/s: no wait", 8 << 10, 16 * time.Microsecond, 0},
	} {
		s := &Conn{window: 5 * time.Millisecond, gathered: c.gathered}
		if c.elapsed > 0 {
			s.since = now.Add(-c.elapsed)
		}
		if got := s.nextWait(now); got != c.want {
			t.Errorf("%s: wait %s, want %s", c.name, got, c.want)
		}
	}
	if got := (&Conn{}).nextWait(now); got != 0 {
		t.Errorf("no window: wait %s, want none", got)
	}
}
