package relay

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/dbsqlc"
)

// holdRecheck is how often, at most, the relay asks outbox_quarantine
// whether a blocked aggregate's events are still there when it meets a new
// event of it: a discard leaves no trace in the WAL.
const holdRecheck = time.Second

// aggregateHold keeps each aggregate's order across quarantine
// (Config.QuarantineOrder keep). Its rule: no event of an aggregate reaches
// Kafka after an earlier event of the same aggregate went to quarantine,
// until that one is requeued or discarded.
//
// Kafka refuses a record asynchronously, after the relay may have sent the
// next ones, so an aggregate has at most one record out at a time: the next
// waits for its acknowledgement (released) or its quarantine (then every
// waiting record is quarantined behind it, in order). An aggregate with
// quarantined events is blocked: each new event is quarantined behind them
// at once. The blocked set is loaded from outbox_quarantine when a session
// starts and kept in step as the session quarantines.
//
// An event comes back through the WAL when it is requeued: its id is that
// of a quarantined event, with another commit LSN (the same commit LSN is
// the session meeting it again after a restart: it stays quarantined). It
// is published unless an event quarantined before it is still held. A
// requeued event holds its aggregate until the relay meets it again; a
// discarded one (in neither outbox_quarantine nor the outbox) is forgotten
// when the relay next asks the table (at most every holdRecheck for new
// events, and whenever a requeued event would wait behind it).
type aggregateHold struct {
	// quarantine hands a record to the quarantiner; called in order, under
	// mu.
	quarantine func(quarantined)
	// release sends a record whose turn came to Kafka; never called under mu.
	release func(*inflight)
	// gone returns those of ids that are in neither outbox_quarantine nor
	// the outbox: discarded.
	gone func(ctx context.Context, ids []uuid.UUID) ([]uuid.UUID, error)
	log  *slog.Logger
	now  func() time.Time

	mu   sync.Mutex
	aggs map[aggregateKey]*heldAggregate
	pos  uint64 // quarantine order
}

type aggregateKey struct{ typ, id string }

func keyOf(p *inflight) aggregateKey {
	return aggregateKey{string(p.row.AggregateType), string(p.row.AggregateID)}
}

func (k aggregateKey) String() string { return k.typ + "/" + k.id }

// heldAggregate is an aggregate with a record out, records waiting, or
// quarantined events.
type heldAggregate struct {
	out     *inflight   // sent to Kafka, not yet acknowledged or quarantined
	waiting []*inflight // behind out, in publication order
	events  map[uuid.UUID]heldEvent
	order   []heldRef // events by pos; refs to events that left are skipped
	checked time.Time // when outbox_quarantine was last asked
	checkAt pglogrepl.LSN
}

// heldEvent is a quarantined event, or a requeued one not yet met again.
type heldEvent struct {
	lsn pglogrepl.LSN // commit LSN of the transaction that wrote it; 0 if unknown
	pos uint64
}

type heldRef struct {
	id  uuid.UUID
	pos uint64
}

func newAggregateHold(log *slog.Logger) *aggregateHold {
	return &aggregateHold{log: log, now: time.Now, aggs: map[aggregateKey]*heldAggregate{}}
}

// loadAggregateHold builds the hold of a session from outbox_quarantine.
func loadAggregateHold(ctx context.Context, db dbsqlc.DBTX, q *dbsqlc.Queries, log *slog.Logger) (*aggregateHold, error) {
	rows, err := q.OutboxQuarantineHolds(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("load the aggregates held behind quarantined events: %w", err)
	}
	h := newAggregateHold(log)
	h.gone = func(ctx context.Context, ids []uuid.UUID) ([]uuid.UUID, error) {
		return q.OutboxQuarantineGone(ctx, db, ids)
	}
	for _, r := range rows {
		var lsn pglogrepl.LSN
		if r.CommitLsn != nil {
			if lsn, err = pglogrepl.ParseLSN(*r.CommitLsn); err != nil {
				return nil, fmt.Errorf("quarantined event %s: commit LSN %q: %w", r.ID, *r.CommitLsn, err)
			}
		}
		h.add(h.aggregate(aggregateKey{r.AggregateType, r.AggregateID}), r.ID, lsn)
	}
	if len(h.aggs) > 0 {
		log.Info("quarantine order kept: aggregates with quarantined events are held until they are requeued or discarded",
			slog.Int("aggregates", len(h.aggs)), slog.Int("events", len(rows)))
	}
	return h, nil
}

func (h *aggregateHold) aggregate(k aggregateKey) *heldAggregate {
	a := h.aggs[k]
	if a == nil {
		a = &heldAggregate{events: map[uuid.UUID]heldEvent{}}
		h.aggs[k] = a
	}
	return a
}

func (h *aggregateHold) add(a *heldAggregate, id uuid.UUID, lsn pglogrepl.LSN) {
	h.pos++
	a.events[id] = heldEvent{lsn: lsn, pos: h.pos}
	a.order = append(a.order, heldRef{id, h.pos})
}

// first is the aggregate's oldest held event.
func (a *heldAggregate) first() (heldRef, bool) {
	for len(a.order) > 0 {
		r := a.order[0]
		if e, ok := a.events[r.id]; ok && e.pos == r.pos {
			return r, true
		}
		a.order = a.order[1:]
	}
	return heldRef{}, false
}

// tidy forgets an aggregate with nothing left to keep in order.
func (h *aggregateHold) tidy(k aggregateKey, a *heldAggregate) {
	if a.out == nil && len(a.waiting) == 0 && len(a.events) == 0 {
		delete(h.aggs, k)
	}
}

// admit decides p's fate as the session publishes it: true sends it to
// Kafka now; false means it waits behind its aggregate's record out, or was
// quarantined behind a held event.
func (h *aggregateHold) admit(ctx context.Context, p *inflight) bool {
	k := keyOf(p)
	id := uuid.UUID(p.row.ID)
	h.mu.Lock()
	defer h.mu.Unlock()
	a := h.aggs[k]
	if a == nil {
		a = h.aggregate(k)
		a.out = p
		return true
	}
	ev, known := a.events[id]
	switch {
	case known && ev.lsn != 0 && ev.lsn == p.lsn:
		// Met again after a restart: it is quarantined already (the row
		// is kept; this insert finds it), and stays so.
		h.quarantine(quarantined{p: p, reason: ReasonBehindQuarantined, err: fmt.Errorf("met again after a restart; still quarantined")})
		return false
	case known:
		// Requeued. It waits only for events quarantined before it.
		delete(a.events, id)
		if r, ok := a.first(); ok && r.pos < ev.pos && p.lsn > a.checkAt {
			h.recheck(ctx, k, a, p.lsn)
		}
		if r, ok := a.first(); ok && r.pos < ev.pos {
			h.behind(a, p, r.id)
			return false
		}
		h.log.Info("a requeued event of a held aggregate is on its way, in order",
			slog.String("aggregate", k.String()), slog.String("id", id.String()))
	default:
		if _, blocked := a.first(); blocked && h.now().Sub(a.checked) >= holdRecheck {
			h.recheck(ctx, k, a, p.lsn)
		}
		if r, blocked := a.first(); blocked {
			h.behind(a, p, r.id)
			return false
		}
	}
	if a.out != nil {
		a.waiting = append(a.waiting, p)
		return false
	}
	a.out = p
	return true
}

// recheck asks outbox_quarantine which of a's held events are gone for
// good (discarded) and forgets them. mu is released meanwhile: only the
// session's goroutine removes held events, and those added meanwhile were
// not asked about.
func (h *aggregateHold) recheck(ctx context.Context, k aggregateKey, a *heldAggregate, at pglogrepl.LSN) {
	ids := make([]uuid.UUID, 0, len(a.events))
	for id := range a.events {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	gone, err := h.gone(qctx, ids)
	cancel()
	h.mu.Lock()
	if err != nil {
		// Still held: a later event asks again.
		h.log.Warn("cannot ask outbox_quarantine whether a held aggregate's events were discarded; it stays held",
			slog.String("aggregate", k.String()), slog.String("error", err.Error()))
		return
	}
	a.checked, a.checkAt = h.now(), at
	for _, id := range gone {
		delete(a.events, id)
	}
	if _, blocked := a.first(); !blocked && len(gone) > 0 {
		h.log.Info("a held aggregate is released: its quarantined events were discarded", slog.String("aggregate", k.String()))
	}
}

// behind quarantines p behind the held event first. Called with mu held.
func (h *aggregateHold) behind(a *heldAggregate, p *inflight, first uuid.UUID) {
	h.add(a, p.row.ID, p.lsn)
	h.quarantine(quarantined{p: p, reason: ReasonBehindQuarantined,
		err: fmt.Errorf("held behind quarantined event %s of aggregate %s/%s (quarantine order keep): requeue or discard it",
			first, p.row.AggregateType, p.row.AggregateID)})
}

// refused takes q.p, which Kafka refused for good, to quarantine, and the
// records of its aggregate waiting behind it after it.
func (h *aggregateHold) refused(q quarantined) {
	p := q.p
	k := keyOf(p)
	h.mu.Lock()
	defer h.mu.Unlock()
	a := h.aggregate(k)
	if _, blocked := a.first(); !blocked {
		h.log.Warn("an event of an aggregate is quarantined: its later events are quarantined behind it until it is requeued or discarded",
			slog.String("aggregate", k.String()), slog.String("id", p.row.ID.String()), slog.String("reason", string(q.reason)))
	}
	h.add(a, p.row.ID, p.lsn)
	h.quarantine(q)
	if a.out != p {
		return
	}
	a.out = nil
	first, _ := a.first()
	for _, w := range a.waiting {
		h.behind(a, w, first.id)
	}
	a.waiting = nil
}

// acknowledged releases the next record of p's aggregate, now that Kafka
// took p.
func (h *aggregateHold) acknowledged(p *inflight) {
	k := keyOf(p)
	h.mu.Lock()
	a := h.aggs[k]
	if a == nil || a.out != p {
		h.mu.Unlock()
		return
	}
	var next *inflight
	if len(a.waiting) > 0 {
		next, a.waiting = a.waiting[0], a.waiting[1:]
	}
	a.out = next
	h.tidy(k, a)
	h.mu.Unlock()
	if next != nil {
		h.release(next)
	}
}

// held reports how many aggregates are blocked, for tests.
func (h *aggregateHold) held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, a := range h.aggs {
		if _, ok := a.first(); ok {
			n++
		}
	}
	return n
}

// holdAggregates gives the session its aggregateHold when
// Config.QuarantineOrder is keep: loaded from outbox_quarantine, quarantining
// through the session's quarantiner and releasing records, in order, from a
// goroutine of its own (a promise must not produce: Produce can block).
func (s *session) holdAggregates(ctx context.Context, pool *pgxpool.Pool) error {
	if s.cfg.QuarantineOrder != QuarantineOrderKeep || s.cfg.unsafeConfirmOnSend {
		return nil
	}
	h, err := loadAggregateHold(ctx, pool, s.r.queries, s.log)
	if err != nil {
		return err
	}
	h.quarantine = func(q quarantined) { s.quar.in <- q }
	// Each record in it is in flight, so it never holds more than the
	// in-flight budget.
	next := make(chan *inflight, s.cfg.MaxInFlightRecords+1)
	h.release = func(p *inflight) { next <- p }
	go func() {
		for {
			select {
			case <-s.sctx.Done():
				return
			case p := <-next:
				s.send(p, topicProblem(p.rec.Topic))
			}
		}
	}()
	s.hold = h
	return nil
}
