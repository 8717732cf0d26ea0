// Package backoff is Ferry's one retry curve, shared by the relay's
// reconnections, its quarantine writes and the worker's retries.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Delay returns the wait after the n-th failure in a row (n >= 1): base
// doubled n-1 times and capped at ceiling, call it d, less random jitter of
// up to half of d. Every wait falls within [d/2, d], so processes or
// partitions that failed together do not retry in lockstep, and no wait
// exceeds ceiling. A base or ceiling of zero or less gives no wait.
func Delay(n int, base, ceiling time.Duration) time.Duration {
	if base <= 0 || ceiling <= 0 {
		return 0
	}
	d := min(base, ceiling)
	for i := 1; i < n && d < ceiling; i++ {
		d = min(2*d, ceiling)
	}
	half := d / 2
	return d - rand.N(half+1)
}

// Sequence follows the curve for a retry loop that counts its own
// failures: Next returns the wait after one more failure, Reset starts over
// after a success that lasted. The zero value waits nothing; set Base and
// Ceiling.
type Sequence struct {
	Base    time.Duration // the first wait, before jitter
	Ceiling time.Duration // no wait is longer
	n       int
}

// Next counts a failure and returns how long to wait before trying again.
func (s *Sequence) Next() time.Duration {
	s.n++
	return Delay(s.n, s.Base, s.Ceiling)
}

// Reset forgets the failures counted so far: the next wait is Base again.
func (s *Sequence) Reset() { s.n = 0 }
