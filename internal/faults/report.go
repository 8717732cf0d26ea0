package faults

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Report is what a run found: the figures and the verdict.
type Report struct {
	Title   string
	Run     string // run id: names its database, topic and slot
	Seed    uint64
	Stack   string // PostgreSQL and Kafka versions
	Broker  string // BrokerKafka or BrokerRabbitMQ
	Elapsed time.Duration

	Load      LoadResult       // as the load generator saw it
	Committed CommittedFigures // as the outbox table holds it
	Aborted   AbortedFigures
	Faults    []Fault

	// TopicRecords is every record on the run's topic; TopicDistinct the
	// distinct ids among them. The difference was published more than once.
	TopicRecords, TopicDistinct int64
	// InboxDuplicates is the workers' ferry_worker_duplicates_skipped_total,
	// summed over processes and restarts (scraped each second and just
	// before each kill: a killed worker's last second may be missing).
	InboxDuplicates int64
	// Redelivered is, on RabbitMQ, the workers' ferry_worker_redelivered_total
	// (deliveries the broker marked redelivered), summed like
	// InboxDuplicates. A queue cannot be read again, so TopicRecords and
	// TopicDistinct stay 0 there: the duplicates RabbitMQ delivered are
	// these counters.
	Redelivered int64

	Consumers         []ConsumerFigures
	QuarantineReasons map[string]int64
	DeadLetterReasons map[string]int64

	// Crashes are processes (relay, workers) that exited by themselves.
	Crashes []string

	// Migration is what a migration run (RunMigration) adds; nil otherwise.
	Migration *MigrationFigures
	// Lossy is what a run over a lossy new channel (RunLossyMigration)
	// adds; nil otherwise.
	Lossy *LossyFigures

	Drained bool
	// DrainAfterFault is the time from the last fault healing to the
	// pipeline being drained; DrainAfterLoad from the load generator's end.
	DrainAfterFault, DrainAfterLoad time.Duration
}

// FaultCounts returns how many faults of each kind were injected.
func (r *Report) FaultCounts() map[FaultKind]int {
	out := map[FaultKind]int{}
	for _, f := range r.Faults {
		out[f.Kind]++
	}
	return out
}

// consumer returns the checker's figures of a consumer (zero if unknown).
func (r *Report) consumer(name string) ConsumerFigures {
	for _, c := range r.Consumers {
		if c.Consumer == name {
			return c
		}
	}
	return ConsumerFigures{}
}

// Lost sums the lost events over the consumers.
func (r *Report) Lost() int64 {
	var n int64
	for _, c := range r.Consumers {
		n += c.Lost
	}
	return n
}

// Violations lists every broken invariant; none means the run passed.
func (r *Report) Violations() []string {
	var v []string
	if !r.Drained {
		v = append(v, "the pipeline did not drain within the timeout")
	}
	v = append(v, r.Crashes...)
	if len(r.Consumers) == 0 {
		v = append(v, "no consumer was checked")
	}
	for _, c := range r.Consumers {
		add := func(n int64, what string) {
			if n != 0 {
				v = append(v, fmt.Sprintf("%s: %d %s", c.Consumer, n, what))
			}
		}
		add(c.Lost, "committed events lost: no effect, not quarantined, not dead-lettered (M1, M3)")
		add(c.DoubleEffects, "double effects (M1)")
		add(c.Inversions, "effects applied out of version order")
		add(c.Gaps, "effects applied after a version gap")
		add(c.StateMismatches, "aggregates whose final state is not the latest version written (M2)")
		add(c.UnknownEffects, "effects of events that never committed")
	}
	if r.Aborted.Committed != 0 {
		v = append(v, fmt.Sprintf("%d events of failed write transactions are in the outbox", r.Aborted.Committed))
	}
	if r.Aborted.WithEffect != 0 {
		v = append(v, fmt.Sprintf("%d events of failed write transactions took effect", r.Aborted.WithEffect))
	}
	if r.Migration != nil {
		v = append(v, r.Migration.violations()...)
	}
	if r.Lossy != nil {
		v = append(v, r.Lossy.violations()...)
	}
	if r.Committed.Versioned != r.Committed.LatestVersions {
		v = append(v, fmt.Sprintf("the producer committed %d versioned events but its versions add up to %d", r.Committed.Versioned, r.Committed.LatestVersions))
	}
	return v
}

// OK reports whether every invariant held.
func (r *Report) OK() bool { return len(r.Violations()) == 0 }

// ControlCaught says whether a negative control's run shows the checker
// catching the loss the control causes: nil when the run drained and the
// checker reported lost events, otherwise why not. On a run that never
// finished draining, events still on their way count as lost: its verdict
// says nothing about the checker.
func (r *Report) ControlCaught() error {
	switch {
	case !r.Drained:
		return errors.New("the run did not drain, so its lost events may only be late: the checker's verdict means nothing")
	case r.Lost() == 0:
		return errors.New("the checker reported no lost event: it did not see the control's loss")
	}
	return nil
}

// Inversions sums the order inversions over the consumers.
func (r *Report) Inversions() int64 {
	var n int64
	for _, c := range r.Consumers {
		n += c.Inversions
	}
	return n
}

// OrderControlCaught is ControlCaught for a control that reorders instead
// of losing (the requeue control): nil when the run drained and the
// checker reported order inversions.
func (r *Report) OrderControlCaught() error {
	switch {
	case !r.Drained:
		return errors.New("the run did not drain: the checker's verdict means nothing")
	case r.Inversions() == 0:
		return errors.New("the checker reported no order inversion: it did not see the control's reordering")
	}
	return nil
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	verdict := "PASS: every invariant held"
	if v := r.Violations(); len(v) > 0 {
		verdict = fmt.Sprintf("FAIL: %d invariant violations", len(v))
	}
	w("### %s: %s\n\n", r.Title, verdict)
	w("run `%s`, seed %d, %s, %s\n\n", r.Run, r.Seed, r.Stack, r.Elapsed.Round(time.Second))
	w("| figure | value |\n|---|---|\n")
	w("| events committed (outbox rows) | %d in %d transactions (largest %d events): %d versioned across %d aggregates, %d poison, %d oversized |\n",
		r.Committed.Events, r.Committed.Transactions, r.Load.LargestTx, r.Committed.Versioned-r.Committed.Foreign, r.Committed.Aggregates, r.Committed.Poison, r.Committed.Huge)
	if r.Committed.Foreign > 0 {
		w("| events of the producer that is not Ferry's (fault_foreign) | %d versioned |\n", r.Committed.Foreign)
	}
	w("| write transactions that failed | %d rolled back and %d failed on purpose, %d failed by faults, %d commits with unknown outcome (%d of their %d events committed) |\n",
		r.Load.TxRolledBack, r.Load.TxFailed, r.Load.TxFault, r.Load.TxIndeterminate, r.Aborted.IndeterminateCommitted, r.Aborted.Indeterminate)
	w("| events of failed transactions in the outbox / with an effect | %d / %d (of %d) |\n", r.Aborted.Committed, r.Aborted.WithEffect, r.Aborted.Events)
	counts := r.FaultCounts()
	var fk []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fk = append(fk, fmt.Sprintf("%s ×%d", k, counts[k]))
	}
	w("| faults injected | %d: %s |\n", len(r.Faults), strings.Join(fk, ", "))
	if r.Broker == BrokerRabbitMQ {
		w("| records on the topic / distinct ids | not counted: a RabbitMQ queue cannot be read again; the workers' counters below stand for it |\n")
		w("| deliveries RabbitMQ marked redelivered (ferry_worker_redelivered_total, all consumers) | %d |\n", r.Redelivered)
	} else {
		w("| records on the topic / distinct ids | %d / %d |\n", r.TopicRecords, r.TopicDistinct)
		w("| duplicates delivered by Kafka (records published more than once) | %d |\n", r.TopicRecords-r.TopicDistinct)
	}
	w("| duplicate deliveries blocked by the inbox (all consumers) | %d |\n", r.InboxDuplicates)
	w("| quarantined by the relay | %s |\n", reasons(r.QuarantineReasons))
	w("| dead-lettered by the workers (all consumers) | %s |\n", reasons(r.DeadLetterReasons))
	if r.Drained {
		w("| time to drain after the last fault healed / after the load ended | %s / %s |\n",
			r.DrainAfterFault.Round(100*time.Millisecond), r.DrainAfterLoad.Round(100*time.Millisecond))
	} else {
		w("| time to drain | **did not drain** |\n")
	}
	if m := r.Migration; m != nil {
		accepted := 0
		for _, a := range m.Asked {
			if a.Accepted {
				accepted++
			}
		}
		w("| live migration `%s` (%s) | ended in %s; %d requests (%d accepted, %d rejected), %d recorded; forbidden ones accepted %d, answers not as recorded %d |\n",
			m.Plan, m.Route, m.FinalPhase, len(m.Asked), accepted, len(m.Asked)-accepted, m.Recorded, m.ForbiddenAccepted, m.Unrecorded)
		if m.NewKind == BrokerRabbitMQ {
			w("| copies the workers recorded from the new channel (all consumers) / distinct ids | %d / %d |\n", m.NewRecords, m.NewDistinct)
		} else {
			w("| records on the new channel's topic / distinct ids | %d / %d |\n", m.NewRecords, m.NewDistinct)
		}
		if m.ForeignPublished > 0 {
			w("| foreign producer on the old channel, bridged: events published / with a bridged copy recorded by the workers | %d / %d |\n",
				m.ForeignPublished, m.ForeignCopies)
		}
	}
	if l := r.Lossy; l != nil {
		w("| authoritative copies the lossy new channel dropped (%d%%) | %d events |\n", lossyPercent, l.Dropped)
		for _, c := range l.Consumers {
			w("| %s: dropped events quarantined / not / replayed; lost that were dropped / others; out-of-order effects on their aggregates | %d / %d / %d; %d / %d; %d |\n",
				c.Consumer, c.Quarantined, c.NotQuarantined, c.Replayed, c.LostDropped, c.LostOther, r.consumer(c.Consumer).LossyOrder)
		}
		if len(l.RetireRefusals) > 0 {
			w("| OLD_RETIRED before the replay | refused: %s |\n", l.RetireRefusals[0])
		}
	}
	w("\n| consumer | effects | lost | double effects | order inversions | version gaps | final state ≠ latest version | effects of uncommitted events | dead-lettered | quarantined | migration quarantine |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.Consumers {
		w("| %s | %d | **%d** | **%d** | **%d** | %d | %d | %d | %d | %d | %d |\n", c.Consumer, c.Effects, c.Lost, c.DoubleEffects,
			c.Inversions, c.Gaps, c.StateMismatches, c.UnknownEffects, c.DeadLettered, c.Quarantined, c.MigrationQuarantined)
	}
	if m := r.Migration; m != nil {
		w("\n| at | request | answer |\n|---|---|---|\n")
		for i := 0; i < len(m.Asked); {
			a := m.Asked[i]
			n := 1 // the same request asked again with the same answer (a gate retried)
			for i+n < len(m.Asked) && m.Asked[i+n].To == a.To && m.Asked[i+n].Slices == a.Slices && m.Asked[i+n].Reason == a.Reason {
				n++
			}
			req := a.To
			if a.Slices > 0 {
				req += " " + strconv.Itoa(a.Slices)
			}
			if a.Forbidden {
				req += " (forbidden)"
			}
			if n > 1 {
				req += fmt.Sprintf(" ×%d", n)
			}
			w("| %.1fs | %s | %s: %s |\n", a.At.Seconds(), req, map[bool]string{true: "accepted", false: "rejected"}[a.Accepted], a.Reason)
			i += n
		}
	}
	if len(r.Faults) > 0 {
		w("\n| at | fault | target | healed at | detail |\n|---|---|---|---|---|\n")
		faults := slices.Clone(r.Faults)
		slices.SortStableFunc(faults, func(a, b Fault) int { return int(a.At - b.At) })
		for _, f := range faults {
			w("| %.1fs | %s | %s | %.1fs | %s |\n", f.At.Seconds(), f.Kind, f.Target, f.Healed.Seconds(), f.Detail)
		}
	}
	if v := r.Violations(); len(v) > 0 {
		w("\nViolations:\n")
		for _, s := range v {
			w("- %s\n", s)
		}
		for _, c := range r.Consumers {
			if len(c.Missing) > 0 {
				w("- %s: lost ids include %s\n", c.Consumer, strings.Join(c.Missing, ", "))
			}
		}
	}
	return b.String()
}

func reasons(m map[string]int64) string {
	if len(m) == 0 {
		return "0"
	}
	var parts []string
	var total int64
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, m[k]))
		total += m[k]
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, ", "))
}
