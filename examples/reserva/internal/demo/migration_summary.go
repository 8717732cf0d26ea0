package demo

import (
	"bufio"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// applied counts, from the demo's database, the events written and what
// each consumer applied of them.
type applied struct {
	orders, undecided, reservations int
	// Events in the outbox: of the order aggregate (OrderPlaced and
	// OrderNoted), consumed by stock.reservation, and of the stock aggregate
	// (StockReserved and StockRejected), consumed by order.status.
	orderEvents, placedEvents, notedEvents, stockEvents int
	// Inbox rows of each consumer: those of the outbox's events, and all.
	stockApplied, stockInbox, statusApplied, statusInbox int
}

func (m *migrationDemo) applied(ctx context.Context) (applied, error) {
	var a applied
	err := m.pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM orders),
		       (SELECT count(*) FROM orders WHERE status = 'placed'),
		       (SELECT count(*) FROM reservations),
		       (SELECT count(*) FROM outbox WHERE aggregate_type = $1),
		       (SELECT count(*) FROM outbox WHERE aggregate_type = $1 AND event_type = $3),
		       (SELECT count(*) FROM outbox WHERE aggregate_type = $1 AND event_type = $4),
		       (SELECT count(*) FROM outbox WHERE aggregate_type = $2),
		       (SELECT count(*) FROM inbox i JOIN outbox o ON o.id::text = i.message_id AND o.aggregate_type = $1 WHERE i.consumer = $5),
		       (SELECT count(*) FROM inbox WHERE consumer = $5),
		       (SELECT count(*) FROM inbox i JOIN outbox o ON o.id::text = i.message_id AND o.aggregate_type = $2 WHERE i.consumer = $6),
		       (SELECT count(*) FROM inbox WHERE consumer = $6)`,
		reserva.AggregateOrder, reserva.AggregateStock, reserva.EventOrderPlaced, EventOrderNoted,
		reserva.ConsumerStockReservation, reserva.ConsumerOrderStatus).
		Scan(&a.orders, &a.undecided, &a.reservations, &a.orderEvents, &a.placedEvents, &a.notedEvents, &a.stockEvents,
			&a.stockApplied, &a.stockInbox, &a.statusApplied, &a.statusInbox)
	return a, err
}

// drained: every event applied by its consumer. Whether the orders are
// decided is for the checks to say: a handler that records an event
// without its effect leaves an order undecided for good.
func (a applied) drained() bool {
	return a.stockApplied == a.orderEvents && a.statusApplied == a.stockEvents
}

// drain waits until every event is applied and every copy the relay
// acknowledged received, or the drain timeout. From RabbitMQ, also every
// foreign message applied and every copy the bridge must have made
// received.
func (m *migrationDemo) drain(ctx context.Context) bool {
	deadline := time.Now().Add(m.mo.drainTimeout)
	var shown time.Time
	for {
		a, err := m.applied(ctx)
		short := m.routes().short()
		fv, foreign := foreignVerdict{}, ""
		if err == nil && m.foreign != nil {
			fv, err = m.foreignVerdict(ctx, false)
			foreign = fmt.Sprintf(" · foreign applied %d/%d, bridged %d/%d", fv.applied, fv.published, fv.bridgedAfter, fv.after)
		}
		if err == nil && a.drained() && len(short) == 0 && (m.foreign == nil || fv.drained()) {
			m.say("   %s drained: %s applied %d events, %s %d; every copy the relay acknowledged received; %d of %d orders decided%s", m.elapsed(),
				reserva.ConsumerStockReservation, a.stockApplied, reserva.ConsumerOrderStatus, a.statusApplied, a.orders-a.undecided, a.orders, foreign)
			return true
		}
		if err == nil && time.Since(shown) >= 2*time.Second {
			shown = time.Now()
			m.say("   %s undecided %d · %s applied %d/%d · %s applied %d/%d · copies not yet received on %d routes%s", m.elapsed(), a.undecided,
				reserva.ConsumerStockReservation, a.stockApplied, a.orderEvents, reserva.ConsumerOrderStatus, a.statusApplied, a.stockEvents, len(short), foreign)
		}
		if time.Now().After(deadline) {
			m.say("   %s NOT drained after %s", m.elapsed(), m.mo.drainTimeout)
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// foreignVerdict judges the foreign producer's messages by what
// stock.reservation, the consumer of their exchange, recorded: its inbox
// rows and the bridge's copies it received (ferry_inbox_copy, side new).
// With strays, it also counts the consumer's inbox rows that are neither
// an outbox event's nor a foreign message's.
func (m *migrationDemo) foreignVerdict(ctx context.Context, strays bool) (foreignVerdict, error) {
	sent := m.foreign.published()
	ids := make([]string, len(sent))
	for i, s := range sent {
		ids[i] = s.id
	}
	rows, err := m.pool.Query(ctx, `
		SELECT i.message_id, i.processed_at,
		       EXISTS (SELECT 1 FROM ferry_inbox_copy c WHERE c.consumer = i.consumer AND c.message_id = i.message_id AND c.side = 'new')
		FROM inbox i WHERE i.consumer = $1 AND i.message_id = ANY($2)`, reserva.ConsumerStockReservation, ids)
	if err != nil {
		return foreignVerdict{}, err
	}
	seen := map[string]foreignSeen{}
	for rows.Next() {
		var id string
		var f foreignSeen
		if err := rows.Scan(&id, &f.appliedAt, &f.bridged); err != nil {
			rows.Close()
			return foreignVerdict{}, err
		}
		seen[id] = f
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return foreignVerdict{}, err
	}
	n := 0
	if strays {
		if err := m.pool.QueryRow(ctx, `
			SELECT count(*) FROM inbox i
			WHERE i.consumer = $1 AND NOT i.message_id = ANY($2)
			  AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id::text = i.message_id)`, reserva.ConsumerStockReservation, ids).Scan(&n); err != nil {
			return foreignVerdict{}, err
		}
	}
	return judgeForeign(sent, seen, m.bridgeReady, n), nil
}

// check is one line of the verdict.
type check struct {
	name   string
	ok     bool
	detail string
}

var quarantinedLine = regexp.MustCompile(`(?m)^(\d+) quarantined events$`)

// quarantinedCount reads the count `worker migration quarantine list`
// ends with.
func quarantinedCount(out string) (int, bool) {
	match := quarantinedLine.FindStringSubmatch(out)
	if match == nil {
		return 0, false
	}
	n, err := strconv.Atoi(match[1])
	return n, err == nil
}

// quarantine is M3: the events in the workers' migration quarantine, as
// `reserva-worker migration quarantine list` counts them. Expected none;
// any there are replayed (and the run drained again), so that M1 and M2
// judge the state they leave.
func (m *migrationDemo) quarantine(ctx context.Context) (check, error) {
	c := check{name: "M3 events quarantined"}
	args := []string{"migration", "quarantine", "list"}
	m.show("reserva-worker", args...)
	out, err := m.command(ctx, "reserva-worker", args...)
	if err != nil {
		return c, fmt.Errorf("reserva-worker migration quarantine list: %v: %s", err, strings.TrimSpace(out))
	}
	m.showOutput(out)
	n, ok := quarantinedCount(out)
	if !ok {
		return c, fmt.Errorf("reserva-worker migration quarantine list: no count in its output: %s", strings.TrimSpace(out))
	}
	c.ok = n == 0
	c.detail = fmt.Sprintf("%d (`reserva-worker migration quarantine list`; expected 0)", n)
	if n == 0 {
		return c, nil
	}
	args = []string{"migration", "quarantine", "replay", "--all"}
	m.show("reserva-worker", args...)
	out, err = m.command(ctx, "reserva-worker", args...)
	m.showOutput(out)
	if err != nil {
		c.detail += fmt.Sprintf("; replay failed: %v", err)
		return c, nil
	}
	c.detail += "; replayed"
	m.drain(ctx)
	return c, nil
}

// exactlyOnce is M1: each consumer's inbox holds every event of its topic
// and nothing else (but the foreign messages it applied: foreign rows),
// and each effect exists once per event.
func (m *migrationDemo) exactlyOnce(ctx context.Context, a applied, foreign int) (check, error) {
	dls, err := m.deadLetterCount(ctx)
	if err != nil {
		return check{}, err
	}
	var parked, relayQuarantined int
	if err := m.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM inbox_parked), (SELECT count(*) FROM outbox_quarantine)`).
		Scan(&parked, &relayQuarantined); err != nil {
		return check{}, err
	}
	decided := a.orders - a.undecided
	ok := a.stockApplied == a.orderEvents && a.stockInbox == a.orderEvents+foreign && a.reservations == a.placedEvents &&
		a.statusApplied == a.stockEvents && a.statusInbox == a.stockEvents && decided == a.stockEvents &&
		dls == 0 && parked == 0 && relayQuarantined == 0
	rows := fmt.Sprintf("%d rows in all", a.stockInbox)
	if m.foreign != nil {
		rows += fmt.Sprintf(", %d of them foreign messages", foreign)
	}
	return check{name: "M1 every event applied exactly once", ok: ok, detail: fmt.Sprintf(
		"%s: %d of %d events in its inbox (%s), %d reservations for %d OrderPlaced; "+
			"%s: %d of %d events in its inbox (%d rows in all), %d orders decided; "+
			"%d dead letters (%s and B), %d parked, %d quarantined by the relay",
		reserva.ConsumerStockReservation, a.stockApplied, a.orderEvents, rows, a.reservations, a.placedEvents,
		reserva.ConsumerOrderStatus, a.statusApplied, a.stockEvents, a.statusInbox, decided,
		dls, m.oldShort(), parked, relayQuarantined)}, nil
}

// deadLetterCount counts this run's dead letters on both channels.
func (m *migrationDemo) deadLetterCount(ctx context.Context) (int, error) {
	n := 0
	count := func(kopts []kgo.Opt, topics ...string) error {
		for _, t := range topics {
			dls, err := inbox.ListDeadLetters(ctx, kopts, t+".dlq", &inbox.DeadLetterFilter{Since: m.start})
			if err != nil {
				return fmt.Errorf("dead letters of %s: %w", t, err)
			}
			n += len(dls)
		}
		return nil
	}
	if m.rabbit != nil {
		dls, err := m.rabbit.deadLetters(ctx, m.start, true)
		if err != nil {
			return 0, fmt.Errorf("dead letters on RabbitMQ: %w", err)
		}
		n += len(dls)
	} else if err := count(m.kopts, reserva.TopicOrders, reserva.TopicStock); err != nil {
		return 0, err
	}
	if err := count(m.koptB, m.newTopic(reserva.AggregateOrder), m.newTopic(reserva.AggregateStock)); err != nil {
		return 0, err
	}
	return n, nil
}

// finalState is M2: every order decided, its reservation's outcome its
// status, and each product's stock its seed less the items of the orders
// reserved.
func (m *migrationDemo) finalState(ctx context.Context, a applied) (check, error) {
	var mismatched int
	if err := m.pool.QueryRow(ctx, `SELECT count(*) FROM orders o LEFT JOIN reservations r ON r.order_id = o.id
		WHERE r.outcome IS DISTINCT FROM o.status`).Scan(&mismatched); err != nil {
		return check{}, err
	}
	rows, err := m.pool.Query(ctx, `
		SELECT s.sku, s.available, coalesce(sum(i.qty) FILTER (WHERE o.status = 'reserved'), 0)
		FROM stock s LEFT JOIN order_items i ON i.sku = s.sku LEFT JOIN orders o ON o.id = i.order_id
		GROUP BY s.sku, s.available ORDER BY s.sku`)
	if err != nil {
		return check{}, err
	}
	defer rows.Close()
	var skusOK, skusOff int
	var off []string
	for rows.Next() {
		var sku string
		var available, reserved int
		if err := rows.Scan(&sku, &available, &reserved); err != nil {
			return check{}, err
		}
		if skus[sku]-reserved == available {
			skusOK++
		} else {
			skusOff++
			off = append(off, fmt.Sprintf("%s: %d available, %d seeded - %d reserved", sku, available, skus[sku], reserved))
		}
	}
	if err := rows.Err(); err != nil {
		return check{}, err
	}
	var reserved, rejected int
	if err := m.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'reserved'), count(*) FILTER (WHERE status = 'rejected') FROM orders`).
		Scan(&reserved, &rejected); err != nil {
		return check{}, err
	}
	detail := fmt.Sprintf("%d orders: %d reserved, %d rejected, %d undecided; %d whose reservation's outcome is not their status; stock of %d products = seed - items reserved",
		a.orders, reserved, rejected, a.undecided, mismatched, skusOK)
	if skusOff > 0 {
		detail += fmt.Sprintf("; %d products off: %s", skusOff, strings.Join(off, "; "))
	}
	return check{name: "M2 final state", ok: a.undecided == 0 && mismatched == 0 && skusOff == 0 && skusOK == len(skus), detail: detail}, nil
}

// history is M4: `relay migration history` holds every request the demo
// made, in order, with its answer, and a reason for each.
func (m *migrationDemo) history(ctx context.Context) (check, error) {
	c := check{name: "M4 every request recorded"}
	hist, err := (&migration.Controller{DB: m.pool}).History(ctx, m.plan)
	if err != nil {
		return c, err
	}
	var accepted, rejected, wrong int
	for i, d := range hist {
		if d.Accepted {
			accepted++
		} else {
			rejected++
		}
		if i >= len(m.requests) {
			wrong++
			continue
		}
		r := m.requests[i]
		if string(d.To) != r.phase || d.ToSlices != r.slices || d.Accepted != r.accepted || d.Reason == "" {
			wrong++
		}
	}
	var steps []string
	for _, r := range m.requests {
		if r.accepted {
			steps = append(steps, r.String())
		}
	}
	c.ok = len(hist) == len(m.requests) && wrong == 0
	c.detail = fmt.Sprintf("%d requests recorded, %d made: %d accepted (%s), %d rejected, each with its reason; %d differ from what the demo asked and was told",
		len(hist), len(m.requests), accepted, strings.Join(steps, " -> "), rejected, wrong)
	return c, nil
}

// aggregateOrder checks that each aggregate's events were applied in the
// order they were written: for stock.reservation, the order aggregates'
// OrderPlaced (0) and OrderNoted events (1, 2, ...), by the time its inbox
// recorded each (ties are events applied in one transaction, in partition
// order).
func (m *migrationDemo) aggregateOrder(ctx context.Context) (check, error) {
	var aggregates, events, bothSides, backwards, backwardAggregates int
	err := m.pool.QueryRow(ctx, `
		WITH applied AS (
			SELECT o.aggregate_id,
			       CASE WHEN o.event_type = $3 THEN (convert_from(o.payload, 'UTF8')::jsonb->>'seq')::int ELSE 0 END AS seq,
			       i.processed_at,
			       coalesce((SELECT c.side FROM ferry_inbox_copy c WHERE c.consumer = i.consumer AND c.message_id = i.message_id
			                 AND c.role = 'authoritative' ORDER BY c.received_at LIMIT 1), 'old') AS side
			FROM outbox o JOIN inbox i ON i.consumer = $1 AND i.message_id = o.id::text
			WHERE o.aggregate_type = $2),
		several AS (
			SELECT aggregate_id FROM applied GROUP BY aggregate_id HAVING count(*) > 1),
		steps AS (
			SELECT a.aggregate_id, a.side,
			       a.processed_at < lag(a.processed_at) OVER (PARTITION BY a.aggregate_id ORDER BY a.seq) AS backwards
			FROM applied a JOIN several USING (aggregate_id))
		SELECT count(DISTINCT aggregate_id), count(*),
		       (SELECT count(*) FROM (SELECT aggregate_id FROM steps GROUP BY aggregate_id HAVING count(DISTINCT side) > 1) b),
		       count(*) FILTER (WHERE backwards),
		       count(DISTINCT aggregate_id) FILTER (WHERE backwards)
		FROM steps`, reserva.ConsumerStockReservation, reserva.AggregateOrder, EventOrderNoted).
		Scan(&aggregates, &events, &bothSides, &backwards, &backwardAggregates)
	if err != nil {
		return check{}, err
	}
	c := check{name: "order per aggregate", ok: backwards == 0 && (m.mo.notes == 0 || aggregates >= m.mo.notes),
		detail: fmt.Sprintf("%d order aggregates with several events (%d events), %d of them applied from %s: "+
			"%d events applied before an earlier one of their aggregate (in %d aggregates)", aggregates, events, bothSides, m.bothChannels(), backwards, backwardAggregates)}
	return c, nil
}

// routes are the copies of each route (a side and a role): those the
// relay had acknowledged, and those the consumers received.
type routes struct {
	relay, received metricSeries
	old             string // the old channel's name: "A" or "RabbitMQ"
}

func (m *migrationDemo) routes() routes {
	return routes{relay: scrapeAll([]string{m.o.relayAddr}, "ferry_relay_migration_copies_total"),
		received: scrapeAll(m.o.workerAddrs[:], "ferry_worker_migration_copies_total"), old: m.oldShort()}
}

var (
	sides = []migration.Side{migration.OldSide, migration.NewSide}
	roles = []route.Role{route.Authoritative, route.Shadow}
)

// short names the routes on which the consumers received fewer copies
// than the relay had acknowledged, with both figures. A consumer receives
// a copy again after a rebalance, so more is fine.
func (r routes) short() []string {
	var out []string
	for _, side := range sides {
		for _, role := range roles {
			acked := r.relay.sum("side", string(side), "role", string(role))
			got := r.received.sum("side", string(side), "role", string(role))
			if got < acked {
				out = append(out, fmt.Sprintf("%s %s %s: %.0f received of %.0f", r.channel(side), side, role, got, acked))
			}
		}
	}
	return out
}

// delivered checks that every copy the relay had acknowledged reached its
// consumer, shadows included, on both clusters.
func (r routes) delivered() check {
	c := check{name: "copies delivered on every route"}
	var total float64
	for _, side := range sides {
		for _, role := range roles {
			total += r.relay.sum("side", string(side), "role", string(role))
		}
	}
	short := r.short()
	c.ok = len(short) == 0 && total > 0
	switch {
	case total == 0:
		c.detail = "the relay acknowledged no stamped copy"
	case c.ok:
		c.detail = fmt.Sprintf("the consumers received all %.0f stamped copies the relay had acknowledged, on the 4 routes", total)
	default:
		c.detail = "fewer received than acknowledged: " + strings.Join(short, "; ")
	}
	return c
}

// print shows the copies of each route, the duplicates the inbox skipped
// and the copies held for fences, per consumer.
func (r routes) print(w *bufio.Writer, workers []string) {
	dups := scrapeAll(workers, "ferry_worker_migration_duplicates_total")
	skipped := scrapeAll(workers, "ferry_worker_duplicates_skipped_total")
	held := scrapeAll(workers, "ferry_worker_migration_held_total")
	c1, c2 := reserva.ConsumerStockReservation, reserva.ConsumerOrderStatus
	width := 41 + len(r.old) // the longest label fits
	line := func(label, relay string, v1, v2 float64) {
		fmt.Fprintf(w, "    %-*s %12s %18.0f %14.0f\n", width, label, relay, v1, v2)
	}
	fmt.Fprintf(w, "    %-*s %12s %18s %14s\n", width, "route", "relay acked", c1, c2)
	for _, side := range sides {
		for _, role := range roles {
			line(fmt.Sprintf("%s (%s) %s", r.channel(side), side, role),
				fmt.Sprintf("%.0f", r.relay.sum("side", string(side), "role", string(role))),
				r.received.sum("consumer", c1, "side", string(side), "role", string(role)),
				r.received.sum("consumer", c2, "side", string(side), "role", string(role)))
		}
	}
	for _, side := range sides {
		line(fmt.Sprintf("duplicates skipped, %s (%s) authoritative", r.channel(side), side), "-",
			dups.sum("consumer", c1, "side", string(side)), dups.sum("consumer", c2, "side", string(side)))
	}
	line("duplicates skipped by the inbox, all", "-", skipped.sum("consumer", c1), skipped.sum("consumer", c2))
	other := "cluster's"
	if r.old != "A" {
		other = "channel's"
	}
	line("held for the other "+other+" fences", "-", held.sum("consumer", c1), held.sum("consumer", c2))
}

// channel names a side's channel.
func (r routes) channel(side migration.Side) string {
	if side == migration.OldSide {
		return r.old
	}
	return "B"
}

// summary prints the history (M4) and the figures of the run with the
// checks, and returns the names of the checks that failed. bridged are the
// bridge's counts, from RabbitMQ.
func (m *migrationDemo) summary(ctx context.Context, drained bool, bridged bridgeCounts) ([]string, error) {
	m.step("the migration quarantine (M3)")
	m3, err := m.quarantine(ctx)
	if err != nil {
		return nil, err
	}
	m.step("the plan's history (M4)")
	args := []string{"migration", "history", m.plan}
	m.show("relay", args...)
	out, err := m.command(ctx, "relay", args...)
	if err != nil {
		return nil, fmt.Errorf("relay migration history: %v: %s", err, strings.TrimSpace(out))
	}
	m.showOutput(out)

	a, err := m.applied(ctx)
	if err != nil {
		return nil, err
	}
	var fv foreignVerdict
	if m.foreign != nil {
		if fv, err = m.foreignVerdict(ctx, true); err != nil {
			return nil, err
		}
	}
	m1, err := m.exactlyOnce(ctx, a, fv.applied)
	if err != nil {
		return nil, err
	}
	m2, err := m.finalState(ctx, a)
	if err != nil {
		return nil, err
	}
	m4, err := m.history(ctx)
	if err != nil {
		return nil, err
	}
	order, err := m.aggregateOrder(ctx)
	if err != nil {
		return nil, err
	}
	lat, err := m.latency(ctx, time.Time{})
	if err != nil {
		return nil, err
	}
	rs := m.routes()
	checks := []check{m1, m2, m3, m4, order, rs.delivered()}
	if m.foreign != nil {
		checks = append(checks, fv.checks()...)
	}
	if !drained {
		checks = append(checks, check{name: "drained", detail: fmt.Sprintf("not every event applied %s after the last order", m.mo.drainTimeout)})
	}

	w := bufio.NewWriter(m.out)
	defer w.Flush()
	row := func(label, value string) { fmt.Fprintf(w, "  %-38s %s\n", label, value) }
	fmt.Fprintf(w, "\n== reserva live migration summary (%s): plan %s, %s -> cluster B\n", time.Since(m.start).Round(time.Second), m.plan, m.oldName())
	placing := fmt.Sprintf("%d, at %.0f a second (--rate %d), from start to end", a.orders, m.pace.rate(), m.o.rate)
	if behind := m.pace.behind(); behind >= behindShown {
		placing += fmt.Sprintf(": %.1fs behind, every client waiting for the API", behind.Seconds())
	}
	row("orders placed (HTTP 201)", placing)
	row("events written to the outbox", fmt.Sprintf("%d OrderPlaced + %d OrderNoted (on %d orders) + %d StockReserved/StockRejected",
		a.placedEvents, a.notedEvents, m.mo.notes, a.stockEvents))
	row("order placed -> decided latency", lat.String())
	if m.foreign != nil {
		publishing := fmt.Sprintf("%d %s on %d aggregates to RabbitMQ's %s (%d with a message id, %d with an id header, %d with no id), at %.0f a second (--foreign-rate %d)",
			fv.published, EventForeignNoted, fv.aggregates, m.foreign.exchange,
			fv.publishedBy[carrierMessageID], fv.publishedBy[carrierHeader], fv.publishedBy[carrierNone], m.foreign.pace.rate(), m.foreign.rate)
		if behind := m.foreign.pace.behind(); behind >= behindShown {
			publishing += fmt.Sprintf(": %.1fs behind, each message waiting for its confirm", behind.Seconds())
		}
		row("foreign producer (not Ferry's)", publishing)
		row("relay bridge", fmt.Sprintf("started %.1fs in, while OLD_ONLY; copied %d messages to %s (%d with a derived id): the foreign ones its queues took, "+
			"and the relay's own until DUAL_WRITE stamped them; the inbox applied each from whichever copy came first",
			m.bridgeReady.Sub(m.start).Seconds(), bridged.Copied, m.newTopic(reserva.AggregateOrder), bridged.Derived))
	}
	if !m.retiredAt.IsZero() {
		var after int
		_ = m.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE created_at >= $1`, m.retiredAt).Scan(&after)
		row("orders placed after OLD_RETIRED", fmt.Sprintf("%d, through cluster B only", after))
	}
	if m.foreign != nil {
		fmt.Fprintln(w, "  copies per route (the relay's and both workers' counters; the workers' summed; B authoritative counts the bridge's copies too):")
	} else {
		fmt.Fprintln(w, "  copies per route (the relay's and both workers' counters; the workers' summed):")
	}
	rs.print(w, m.o.workerAddrs[:])
	fmt.Fprintln(w, "  checks:")
	var failed []string
	for _, c := range checks {
		verdict := "ok"
		if !c.ok {
			verdict = "FAIL"
			failed = append(failed, c.name)
		}
		fmt.Fprintf(w, "  %-4s %-36s %s\n", verdict, c.name, c.detail)
	}
	row("metrics", fmt.Sprintf("relay http://%s/metrics · workers http://%s/metrics http://%s/metrics", m.o.relayAddr, m.o.workerAddrs[0], m.o.workerAddrs[1]))
	row("logs", m.dir)
	return failed, nil
}
