package demo

import (
	"fmt"
	"slices"
	"time"

	"github.com/ferryhq/ferry/examples/reserva"
)

// foreignSeen is what the consumer of the foreign producer's exchange
// recorded of one of its messages.
type foreignSeen struct {
	appliedAt time.Time // its inbox row's processed_at
	bridged   bool      // the consumer received the bridge's copy (from the new channel) too
}

// foreignVerdict holds the foreign producer's messages to the demo's
// invariants: each applied once (M1), each aggregate's last note the last
// applied (M2), each aggregate's notes applied in the order published, and
// every message published once the bridge's queues existed copied by it.
type foreignVerdict struct {
	published, applied     int
	publishedBy, appliedBy [carriers]int // by how the id came
	// strays are inbox rows of the consumer that are no event's: a message
	// applied under a second id.
	strays int
	// aggregates are the foreign aggregates; backwards the notes applied
	// before an earlier one of theirs, in backwardAggregates of them;
	// lastOff those whose last applied note is not their last published.
	aggregates, backwards, backwardAggregates, lastOff int
	// after are the messages confirmed once the bridge's queues existed,
	// bridgedAfter those of them whose bridged copy the consumer received;
	// before and bridgedBefore the same for the earlier ones, which only
	// the workers' queues hold.
	after, bridgedAfter, before, bridgedBefore int
}

// judgeForeign judges the messages sent from what the consumer recorded
// (seen, by id), the time the bridge's queues were known to exist, and the
// consumer's stray inbox rows.
func judgeForeign(sent []foreignSent, seen map[string]foreignSeen, bridgeReady time.Time, strays int) foreignVerdict {
	v := foreignVerdict{published: len(sent), strays: strays}
	byAggregate := map[string][]foreignSent{}
	for _, s := range sent {
		byAggregate[s.aggregate] = append(byAggregate[s.aggregate], s)
		v.publishedBy[s.carrier]++
		got, ok := seen[s.id]
		if ok {
			v.applied++
			v.appliedBy[s.carrier]++
		}
		if s.confirmed.After(bridgeReady) {
			v.after++
			if got.bridged {
				v.bridgedAfter++
			}
		} else {
			v.before++
			if got.bridged {
				v.bridgedBefore++
			}
		}
	}
	v.aggregates = len(byAggregate)
	for _, notes := range byAggregate {
		slices.SortFunc(notes, func(a, b foreignSent) int { return a.seq - b.seq })
		var prev, last time.Time
		lastSeq, backwards := 0, 0
		for _, s := range notes {
			got, ok := seen[s.id]
			if !ok {
				continue
			}
			// Ties are notes applied in one transaction, in queue order.
			if got.appliedAt.Before(prev) {
				backwards++
			}
			prev = got.appliedAt
			if !got.appliedAt.Before(last) {
				last, lastSeq = got.appliedAt, s.seq
			}
		}
		v.backwards += backwards
		if backwards > 0 {
			v.backwardAggregates++
		}
		if lastSeq != notes[len(notes)-1].seq {
			v.lastOff++
		}
	}
	return v
}

// drained says whether every message is applied and every copy the bridge
// must have made received.
func (v foreignVerdict) drained() bool {
	return v.applied == v.published && v.bridgedAfter == v.after
}

// checks are the verdict's lines in the summary.
func (v foreignVerdict) checks() []check {
	c := reserva.ConsumerStockReservation
	return []check{
		{name: "M1 foreign messages exactly once", ok: v.published > 0 && v.applied == v.published && v.strays == 0,
			detail: fmt.Sprintf("%s: %d of %d %s in its inbox, one row each (%d by message id, %d by id header, %d by the id derived from exchange, routing key and body); "+
				"%d inbox rows that are no event's (a message applied under a second id)",
				c, v.applied, v.published, EventForeignNoted, v.appliedBy[carrierMessageID], v.appliedBy[carrierHeader], v.appliedBy[carrierNone], v.strays)},
		{name: "M2 foreign final state", ok: v.aggregates > 0 && v.lastOff == 0,
			detail: fmt.Sprintf("%d foreign aggregates: %d whose last note applied is not the last published", v.aggregates, v.lastOff)},
		{name: "order per foreign aggregate", ok: v.backwards == 0,
			detail: fmt.Sprintf("%d notes applied before an earlier one of their aggregate (in %d aggregates)", v.backwards, v.backwardAggregates)},
		{name: "foreign messages bridged", ok: v.after > 0 && v.bridgedAfter == v.after,
			detail: fmt.Sprintf("%s received the bridge's copy of %d of the %d published once its queues existed (and of %d of the %d before, which only the workers' queues hold)",
				c, v.bridgedAfter, v.after, v.bridgedBefore, v.before)},
	}
}
