package inbox

import (
	"math/rand/v2"
	"time"
)

// backoff returns the wait after the n-th failure (n >= 1): base doubled
// n-1 times, capped at ceiling, minus random jitter of up to half, so that
// partitions failing together do not retry in lockstep.
func backoff(n int, base, ceiling time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	half := d / 2
	if half <= 0 {
		return d
	}
	return d - time.Duration(rand.Int64N(int64(half)+1))
}
