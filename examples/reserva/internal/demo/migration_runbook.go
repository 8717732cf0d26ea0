package demo

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// migrate drives the plan through the runbook of docs/migration.md with the real commands
// while the orders flow: create, DUAL_WRITE, the shadow gate, CUTOVER 6, 32,
// 64 and 128, the rollback drill (DUAL_WRITE, CUTOVER 128), OLD_RETIRED.
// From RabbitMQ, the bridge starts between create and DUAL_WRITE.
func (m *migrationDemo) migrate(ctx context.Context) error {
	m.phase = string(migration.OldOnly)
	if err := m.pause(ctx); err != nil {
		return err
	}

	m.step("create the plan: old = %s with the relay's template, new = cluster B with %s", m.oldName(), m.mo.newTemplate)
	args := []string{"migration", "create", m.plan}
	if m.rabbit != nil {
		args = append(args, "--old-kind", brokerRabbitMQ, "--old-url", m.rabbit.cfg.URL, "--old-password-env", rabbitPasswordEnv,
			"--old-shards", strconv.Itoa(m.rabbit.cfg.Shards))
	} else {
		args = append(args, "--old-brokers", m.o.brokers)
	}
	args = append(args, "--old-topic-template", oldTemplate,
		"--new-brokers", m.mo.brokersB, "--new-topic-template", m.mo.newTemplate,
		"--groups", reserva.ConsumerStockReservation+","+reserva.ConsumerOrderStatus)
	m.show("relay", args...)
	out, err := m.command(ctx, "relay", args...)
	if err != nil {
		return fmt.Errorf("relay migration create: %v: %s", err, strings.TrimSpace(out))
	}
	m.showOutput(out)
	st, err := (&migration.Controller{DB: m.pool}).State(ctx, m.plan)
	if err != nil {
		return err
	}
	m.planDef = st.Plan
	if m.rabbit != nil {
		if err := m.startBridge(ctx); err != nil {
			return err
		}
	}

	m.step("DUAL_WRITE: the relay writes every event to %s from this point of the commit order; %s's copy is authoritative, B's a shadow",
		m.bothChannels(), m.oldShort())
	if err := m.mustRequest(ctx, string(migration.DualWrite), 0); err != nil {
		return err
	}
	m.say("   the workers know %s only: the relay's fences on %s name cluster B and its topics, and the workers follow", m.oldName(), m.oldShort())

	m.step("shadow gate, then CUTOVER 6: every group's newest report must show events checked, none missing, no mismatch, p99 within bound")
	if err := m.requestUntil(ctx, string(migration.Cutover), 6); err != nil {
		return err
	}
	if err := m.showReports(ctx, "the reports that opened the shadow gate"); err != nil {
		return err
	}
	if err := m.pause(ctx); err != nil {
		return err
	}
	for _, k := range []int{32, 64, migration.Slices} {
		m.step("CUTOVER %d: the aggregates of slices 0-%d are applied from cluster B; B's copy authoritative, %s's a shadow", k, k-1, m.oldShort())
		if err := m.mustRequest(ctx, string(migration.Cutover), k); err != nil {
			return err
		}
		if err := m.pause(ctx); err != nil {
			return err
		}
	}

	m.step("OLD_RETIRED too early: every slice is on B, but no way back was rehearsed yet")
	m.show("relay", m.requestArgs(string(migration.OldRetired), 0)...)
	r, out, err := m.ask(ctx, string(migration.OldRetired), 0)
	if err != nil {
		return err
	}
	m.showOutput(out)
	if r.accepted {
		return fmt.Errorf("%s accepted before any rollback drill", r)
	}

	m.step("rollback drill: DUAL_WRITE again, %s authoritative for every aggregate; the relay still writes %s", m.oldShort(), m.bothChannels())
	if err := m.mustRequest(ctx, string(migration.DualWrite), 0); err != nil {
		return err
	}
	if err := m.pause(ctx); err != nil {
		return err
	}
	m.step("rollback drill: CUTOVER 128 again, through the shadow gate again")
	if err := m.requestUntil(ctx, string(migration.Cutover), migration.Slices); err != nil {
		return err
	}
	if err := m.pause(ctx); err != nil {
		return err
	}

	if m.rabbit != nil {
		if err := m.showProducers(ctx); err != nil {
			return err
		}
	}
	m.step("OLD_RETIRED: wants 128 slices moved, the drill on record, and every group past the fences of the last cutover on %s with an empty quarantine", m.oldShort())
	if err := m.requestUntil(ctx, string(migration.OldRetired), 0); err != nil {
		return err
	}
	m.retiredAt = time.Now()
	if err := m.showReports(ctx, "the reports that let the old channel go"); err != nil {
		return err
	}
	m.say("   the relay writes cluster B only from here; the orders go on")
	if m.rabbit != nil {
		m.say("   the foreign producer still publishes to RabbitMQ: the workers apply its notes there, the bridge copies them to cluster B, the inbox applies one copy")
	}
	return m.pause(ctx)
}

// oldName is the old channel as the progress lines name it: "cluster A"
// or "RabbitMQ"; oldShort is the same in few letters ("A").
func (m *migrationDemo) oldName() string {
	if m.rabbit != nil {
		return "RabbitMQ"
	}
	return "cluster A"
}

func (m *migrationDemo) oldShort() string {
	if m.rabbit != nil {
		return "RabbitMQ"
	}
	return "A"
}

// bothChannels names the old and the new channel together.
func (m *migrationDemo) bothChannels() string {
	if m.rabbit != nil {
		return "RabbitMQ and cluster B"
	}
	return "both clusters"
}

// getenv is the migration commands' environment: m.env, then the demo's.
func (m *migrationDemo) getenv(name string) string {
	for _, kv := range slices.Backward(m.env) {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return os.Getenv(name)
}

// showProducers prints who published what the groups consumed on the
// RabbitMQ old channel, as `relay migration status` lists them: a user
// that is not the relay's must move, or be bridged, before OLD_RETIRED.
func (m *migrationDemo) showProducers(ctx context.Context) error {
	m.step("who publishes on RabbitMQ: the relay as %s, and the foreign producer without a user id, bridged since OLD_ONLY", m.rabbit.conn().User())
	args := []string{"migration", "status", m.plan}
	m.show("relay", args...)
	out, err := m.command(ctx, "relay", args...)
	if err != nil {
		return fmt.Errorf("relay migration status: %v: %s", err, strings.TrimSpace(out))
	}
	if producers := producersSection(out); producers != "" {
		m.say("     (its producers only)")
		out = producers
	}
	m.showOutput(out) // whole when it could not list them: it says why
	return nil
}

// step announces a step of the runbook.
func (m *migrationDemo) step(format string, args ...any) {
	m.say("== %s %s", m.elapsed(), fmt.Sprintf(format, args...))
}

// pause lets the orders flow for the step pause, with a progress line
// every few seconds.
func (m *migrationDemo) pause(ctx context.Context) error {
	const every = 3 * time.Second
	for left := m.mo.stepPause; left > 0; left -= every {
		if err := m.wait(ctx, min(every, left)); err != nil {
			return err
		}
		m.progress(ctx)
	}
	return nil
}

// wait sleeps, and fails when the orders stopped by themselves.
func (m *migrationDemo) wait(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-m.placeDone:
		return fmt.Errorf("placing orders stopped: %v", m.placeErr)
	case <-time.After(d):
		return nil
	}
}

// progress prints one line: the phase, the orders, and the copies the
// relay had acknowledged on each cluster.
func (m *migrationDemo) progress(ctx context.Context) {
	var undecided int
	_ = m.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status = 'placed'`).Scan(&undecided)
	relay := scrapeAll([]string{m.o.relayAddr}, "ferry_relay_migration_copies_total")
	held := scrapeAll(m.o.workerAddrs[:], "ferry_worker_migration_held_total").sum()
	copies := func(side migration.Side) string {
		return fmt.Sprintf("%.0f+%.0f", relay.sum("side", string(side), "role", string(route.Authoritative)),
			relay.sum("side", string(side), "role", string(route.Shadow)))
	}
	foreign := ""
	if m.foreign != nil {
		foreign = fmt.Sprintf(" · foreign published %d", len(m.foreign.published()))
	}
	m.say("   %s %-15s placed %d · undecided %d%s · relay copies (authoritative+shadow) %s %s, B %s · held for fences (total) %.0f",
		m.elapsed(), m.phase, m.placed.Load(), undecided, foreign, m.oldShort(), copies(migration.OldSide), copies(migration.NewSide), held)
}

// showReports prints each group's newest shadow report, as the gates read
// them from ferry.migration.reports on the old channel.
func (m *migrationDemo) showReports(ctx context.Context, title string) error {
	reports, err := (&migration.ReportEvidence{Getenv: m.getenv}).Reports(ctx, m.planDef)
	if err != nil {
		return err
	}
	m.say("   %s (each group's newest, from %s on %s):", title, migration.ReportTopic, m.oldName())
	w := tabwriter.NewWriter(m.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "     GROUP\tAGE\tAUTHORITATIVE\tSHADOW\tCHECKED\tMISSING\tMISMATCHED\tP99 DELAY\tMAX DELAY\tOLD FENCES PASSED\tQUARANTINED")
	for _, g := range m.planDef.Groups {
		r, ok := reports[g]
		if !ok {
			fmt.Fprintf(w, "     %s\tno report\n", g)
			continue
		}
		fmt.Fprintf(w, "     %s\t%.1fs\t%d\t%d\t%d\t%d\t%d\t%s\t%s\tepoch %d\t%d\n", g, time.Since(r.At).Seconds(),
			r.Authoritative, r.Shadow, r.Checked, r.Missing, r.Mismatched,
			r.P99Lateness.Round(time.Millisecond), r.MaxLateness.Round(time.Millisecond), r.OldFenceEpoch, r.Quarantined)
	}
	return w.Flush()
}
