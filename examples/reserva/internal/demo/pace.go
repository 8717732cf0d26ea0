package demo

import (
	"sync"
	"time"
)

// pace follows the schedule on which placeOrders sends the orders: order i
// is due i+1 intervals after the start. An order that goes out late stays
// late, because the ticker drops the ticks it missed rather than catching
// up in a burst, so how late the latest order went is how far the placing
// has fallen behind --rate.
type pace struct {
	mu       sync.Mutex
	interval time.Duration
	start    time.Time
	last     time.Time // when the latest order went out
	sent     int
	lag      time.Duration // how late the latest order went out
}

// begin starts the schedule at start, with one order every interval.
func (p *pace) begin(start time.Time, interval time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.start, p.interval = start, interval
}

// send records that order i (from 0) went out at at.
func (p *pace) send(i int, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last, p.sent = at, i+1
	p.lag = max(at.Sub(p.start.Add(time.Duration(i+1)*p.interval)), 0)
}

// behind returns how late the latest order went out.
func (p *pace) behind() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lag
}

// rate returns the orders sent a second, from the start to the latest.
func (p *pace) rate() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sent == 0 || !p.last.After(p.start) {
		return 0
	}
	return float64(p.sent) / p.last.Sub(p.start).Seconds()
}
