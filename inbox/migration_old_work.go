package inbox

import (
	"sync"
	"time"

	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// The drain of a RabbitMQ old channel waits until it brought a group
// nothing to apply for longer than the group's longest retry backoff plus
// its handler timeout (seed 000): a queue read empty once proves nothing,
// and a message taken and being retried is in no queue. The fences prove
// that the relay's events are applied; this covers what they do not: a
// producer that is not Ferry's, still publishing to an exchange that no
// bridge copies, and the relay's own copies delivered again after them.

// oldWork is when each consumer last took or tried to apply such a
// message (migration.Report.OldWorkedAt), and the exchanges a bridge
// copies, learned from the bridged copies the consumer received.
type oldWork struct {
	mu      sync.Mutex
	last    map[string]time.Time // by consumer
	bridged map[[2]string]bool   // consumer and exchange
}

// touch records work of consumer now.
func (o *oldWork) touch(consumer string) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.last == nil {
		o.last = map[string]time.Time{}
	}
	o.last[consumer] = now
}

// lastOf is when consumer last worked; zero when it never did.
func (o *oldWork) lastOf(consumer string) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.last[consumer]
}

// bridge records that a bridge copies consumer's exchange to the new
// channel: what a producer that is not Ferry's publishes there reaches
// the consumer through the copies too.
func (o *oldWork) bridge(consumer, exchange string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.bridged == nil {
		o.bridged = map[[2]string]bool{}
	}
	o.bridged[[2]string{consumer, exchange}] = true
}

func (o *oldWork) isBridged(consumer, exchange string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bridged[[2]string{consumer, exchange}]
}

// drainWork reports whether a record of p with stamp st is work the drain
// of its RabbitMQ old channel waits for: on the consumer's own RabbitMQ
// channel, an authoritative copy of the old side, or an unstamped message
// of an exchange no bridge copies. Shadow copies and fences are not: the
// relay writes them until the retirement. A bridged copy teaches which
// exchanges a bridge copies.
func (p *partition) drainWork(st *route.Stamp) bool {
	if st != nil && st.Bridged {
		p.w.oldWork.bridge(p.g.name, st.Peer)
	}
	if p.rmq == nil || p.g.follower {
		return false
	}
	if st == nil {
		return !p.w.oldWork.isBridged(p.g.name, p.topic)
	}
	return st.Side == migration.OldSide && st.Role == route.Authoritative
}

// oldQuiet is the OldQuiet of the worker's reports.
func (w *Worker) oldQuiet() time.Duration { return w.cfg.RetryBackoffMax + w.cfg.HandlerTimeout }
