package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// passEvidence lets every request through the gates: these tests are about
// how the relay routes, not about the consumers' evidence.
type passEvidence struct{}

func (passEvidence) ShadowGate(context.Context, migration.Plan, string) error   { return nil }
func (passEvidence) Drained(context.Context, migration.Plan, string, int) error { return nil }

// migrationBundle is a relay test with a plan from the relay's own channel
// on cluster A to a new topic template on cluster B.
type migrationBundle struct {
	*bundle
	oldTopic, newTopic string
	ctl                *migration.Controller
	plan               migration.Plan
	history            route.History // the steps accepted so far
	want               map[string]route.History
}

// setupMigration creates the plan; with newBrokers nil the new channel is
// cluster B, else newBrokers (the new topic exists on B either way).
func setupMigration(t testing.TB, oldPartitions, newPartitions int32, newBrokers []string) *migrationBundle {
	t.Helper()
	b := setup(t)
	m := &migrationBundle{bundle: b, want: map[string]route.History{}}
	m.oldTopic = b.topic(t, "order", oldPartitions)
	newTemplate := "relayb" + strings.TrimPrefix(b.prefix, "relay") + ".{aggregate_type}"
	m.newTopic = strings.ReplaceAll(newTemplate, "{aggregate_type}", "order")
	ferrytest.CreateTopicB(t, m.newTopic, newPartitions)
	if newBrokers == nil {
		newBrokers = ferrytest.BrokersB(t)
	}
	m.ctl = &migration.Controller{DB: b.db.Pool, Evidence: passEvidence{}}
	m.plan = migration.Plan{
		Name:   "move",
		Old:    migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: b.cfg.TopicTemplate},
		New:    migration.Channel{Brokers: newBrokers, TopicTemplate: newTemplate},
		Groups: []string{"stock"},
	}
	if err := m.ctl.Create(b.ctx, m.plan, "test"); err != nil {
		t.Fatal(err)
	}
	m.history = route.History{{Plan: "move", Epoch: 0, Phase: migration.OldOnly}}
	return m
}

// confirmed is the slot's confirmed_flush_lsn.
func (m *migrationBundle) confirmed(t *testing.T) string {
	t.Helper()
	st, err := relay.Status(m.ctx, m.db.Pool, m.slot)
	if err != nil {
		t.Fatal(err)
	}
	return st.ConfirmedFlushLSN
}

// request moves the plan, which must be accepted.
func (m *migrationBundle) request(t testing.TB, to migration.Phase, slices int) {
	t.Helper()
	d, err := m.ctl.Request(m.ctx, m.plan.Name, to, slices, "test")
	if err != nil || !d.Accepted {
		t.Fatalf("request %s %d: %+v, %v", to, slices, d, err)
	}
	m.history = append(m.history, route.Step{Plan: m.plan.Name, Epoch: d.Epoch, Phase: to, Slices: slices})
}

// writeBatch commits n events of 16 aggregates, one transaction each, and
// remembers the history in effect at their commit.
func (m *migrationBundle) writeBatch(t *testing.T, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id := m.write(t, evt("order", fmt.Sprintf("o%d", i%16), len(m.want)))[0]
		m.want[id] = append(route.History(nil), m.history...)
		ids = append(ids, id)
	}
	return ids
}

// stepTo is a step walk asks for.
type stepTo struct {
	phase  migration.Phase
	slices int
}

// walk asks for each step in turn, each accepted, and writes n events
// (writeBatch) after each.
func (m *migrationBundle) walk(t *testing.T, n int, steps ...stepTo) {
	t.Helper()
	for _, st := range steps {
		m.request(t, st.phase, st.slices)
		m.writeBatch(t, n)
	}
}

// writeTx commits n events of 16 aggregates in one transaction, and
// remembers the history in effect at its commit.
func (m *migrationBundle) writeTx(t *testing.T, n int) []string {
	t.Helper()
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = evt("order", fmt.Sprintf("o%d", i%16), len(m.want)+i)
	}
	ids := m.write(t, events...)
	for _, id := range ids {
		m.want[id] = append(route.History(nil), m.history...)
	}
	return ids
}

// walPosition is the server's current WAL position: every transaction
// committed so far ends at or before it.
func (m *migrationBundle) walPosition(t *testing.T) string {
	t.Helper()
	var lsn string
	if err := m.db.Pool.QueryRow(m.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// waitConfirmedPast waits up to a minute until the slot's confirmed
// position is at or past lsn, where what (named in the failure, with r's
// figures) ends.
func (m *migrationBundle) waitConfirmedPast(t *testing.T, r *relay.Relay, lsn, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var past bool
		if err := m.db.Pool.QueryRow(m.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
			m.slot, lsn).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if past {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute on, the slot's confirmed position %s is not past %s, the end of %s; relay stats %+v, Ready: %v",
				m.confirmed(t), lsn, what, r.Stats(), r.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// expected returns the ids that must reach each side.
func (m *migrationBundle) expected() (old, nw []string) {
	for id, h := range m.want {
		for _, c := range h[len(h)-1].Route(nil) { // the sides do not depend on the slice
			if c.Side == migration.OldSide {
				old = append(old, id)
			} else {
				nw = append(nw, id)
			}
		}
	}
	return old, nw
}

// readAll reads topic from the start through cl until every id in want
// arrived, and returns every record (fences included) in offset order per
// partition.
func readAll(t *testing.T, cl *kgo.Client, want []string, timeout time.Duration) []*kgo.Record {
	t.Helper()
	missing := map[string]bool{}
	for _, id := range want {
		missing[id] = true
	}
	var out []*kgo.Record
	deadline := time.Now().Add(timeout)
	for len(missing) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after %s, %d of %d events never arrived (e.g. %v)", timeout, len(missing), len(want), firstKeys(missing, 3))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			delete(missing, header(r, outbox.HeaderID))
		})
	}
	return out
}

// checkCopies fails the test unless every record of side carries the stamp
// its event's history says (epoch, slice, side, role, since, peer), and no
// event reached a side its step does not write.
func (m *migrationBundle) checkCopies(t *testing.T, side migration.Side, recs []*kgo.Record) (copies int) {
	t.Helper()
	peer := map[migration.Side]string{migration.OldSide: m.newTopic, migration.NewSide: m.oldTopic}[side]
	for _, r := range recs {
		if header(r, route.HeaderFence) != "" {
			continue
		}
		id := header(r, outbox.HeaderID)
		h, ok := m.want[id]
		if !ok {
			t.Fatalf("%s side: a record %s the test did not write", side, id)
		}
		step := h[len(h)-1]
		var role route.Role
		for _, c := range step.Route(r.Key) {
			if c.Side == side {
				role = c.Role
			}
		}
		if role == "" {
			t.Errorf("event %s committed under %s %d reached the %s side", id, step.Phase, step.Slices, side)
			continue
		}
		raw := header(r, route.HeaderRoute)
		if step.Phase == migration.OldOnly {
			if raw != "" {
				t.Errorf("event %s committed before the migration carries a stamp %q", id, raw)
			}
			continue
		}
		st, err := route.ParseStamp(raw)
		if err != nil {
			t.Errorf("event %s on the %s side: %v", id, side, err)
			continue
		}
		want := route.Stamp{Plan: m.plan.Name, Epoch: step.Epoch, Slice: route.Slice(r.Key), Side: side, Role: role}
		if role == route.Authoritative && step.Phase != migration.OldRetired {
			if want.Since = h.Since(want.Slice); want.Since > 0 {
				want.Peer = peer
			}
		}
		if st != want {
			t.Errorf("event %s on the %s side: stamp %+v, want %+v", id, side, st, want)
		}
		copies++
	}
	return copies
}

// checkFences fails the test unless every partition of side's topic holds
// a fence of each epoch in epochs (naming the peer topic and carrying the
// other channel), after every record routed by an earlier
// step and before every record routed by it or a later one.
func (m *migrationBundle) checkFences(t *testing.T, side migration.Side, recs []*kgo.Record, partitions int, epochs []int) {
	peer, otherTemplate := m.newTopic, m.plan.New.TopicTemplate
	if side == migration.NewSide {
		peer, otherTemplate = m.oldTopic, m.plan.Old.TopicTemplate
	}
	t.Helper()
	fenceAt := map[int32]map[int]int64{} // partition -> epoch -> offset
	for _, r := range recs {
		v := header(r, route.HeaderFence)
		if v == "" {
			continue
		}
		f, err := route.ParseFence(v)
		if err != nil {
			t.Fatalf("%s side: fence %q: %v", side, v, err)
		}
		if f.Side != side || f.Partitions != partitions || f.Plan != "move" || f.Peer != peer {
			t.Errorf("%s side: fence %+v, want side %s of %d partitions, peer %s", side, f, side, partitions, peer)
		}
		var ch migration.Channel
		if err := json.Unmarshal(r.Value, &ch); err != nil || ch.TopicTemplate != otherTemplate {
			t.Errorf("%s side: fence value %q (%v), want the other channel, topic template %s", side, r.Value, err, otherTemplate)
		}
		if fenceAt[r.Partition] == nil {
			fenceAt[r.Partition] = map[int]int64{}
		}
		if _, ok := fenceAt[r.Partition][f.Epoch]; !ok {
			fenceAt[r.Partition][f.Epoch] = r.Offset
		}
	}
	for p := range int32(partitions) {
		for _, e := range epochs {
			if _, ok := fenceAt[p][e]; !ok {
				t.Errorf("%s side, partition %d: no fence of epoch %d", side, p, e)
			}
		}
	}
	for _, r := range recs {
		if header(r, route.HeaderFence) != "" {
			continue
		}
		epoch := 0
		if st, err := route.ParseStamp(header(r, route.HeaderRoute)); err == nil {
			epoch = st.Epoch
		}
		for e, at := range fenceAt[r.Partition] {
			if epoch < e && r.Offset > at {
				t.Errorf("%s side, partition %d: a record of epoch %d at offset %d is after the fence of epoch %d (offset %d)",
					side, r.Partition, epoch, r.Offset, e, at)
			}
			if epoch >= e && r.Offset < at {
				t.Errorf("%s side, partition %d: a record of epoch %d at offset %d is before the fence of epoch %d (offset %d)",
					side, r.Partition, epoch, r.Offset, e, at)
			}
		}
	}
}

// Through every phase, slice steps and a rollback, each event is written
// to the channels its step names, stamped with that step, its slice, its
// role and since when its side is authoritative: the step in effect at its
// commit, to the transaction (each request commits between two events of
// the same writer). Each step's fences are on every partition of both
// channels, between the records of the steps before and after.
func TestRelayRoutesEveryEventByTheStepInEffectAtItsCommit(t *testing.T) {
	t.Parallel()
	m := setupMigration(t, 3, 4, nil)
	m.start(t, m.cfg)

	m.writeBatch(t, 20)
	m.walk(t, 40,
		stepTo{migration.DualWrite, 0},
		stepTo{migration.Cutover, 6},
		stepTo{migration.Cutover, 64},
		stepTo{migration.DualWrite, 0}, // rollback
		stepTo{migration.Cutover, 32},
		stepTo{migration.Cutover, migration.Slices},
		stepTo{migration.OldRetired, 0},
	)

	wantOld, wantNew := m.expected()
	oldRecs := readAll(t, ferrytest.Client(t, kgo.ConsumeTopics(m.oldTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), wantOld, time.Minute)
	newRecs := readAll(t, ferrytest.ClientB(t, kgo.ConsumeTopics(m.newTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), wantNew, time.Minute)
	nOld := m.checkCopies(t, migration.OldSide, oldRecs)
	nNew := m.checkCopies(t, migration.NewSide, newRecs)
	// Every epoch but the retirement fences both channels (OLD_RETIRED
	// writes the new channel only, after the consumers drained the old).
	m.checkFences(t, migration.OldSide, oldRecs, 3, []int{1, 2, 3, 4, 5, 6})
	m.checkFences(t, migration.NewSide, newRecs, 4, []int{1, 2, 3, 4, 5, 6})
	t.Logf("%d events, %d stamped copies on the old channel, %d on the new", len(m.want), nOld, nNew)
}

// With an in-flight budget of one record (--max-in-flight 1) a step
// applies at its point while events flow, and a transaction of more
// records than the budget streams through the dual write. Before, the
// step's hold counted as an unacknowledged record of its still open
// transaction: it spent the budget, the relay read no further, and the
// commit the step waited for never came. No event after the step reached
// either channel and the slot stayed before the step for good.
func TestMigrationStepAppliesWithAnInFlightBudgetOfOne(t *testing.T) {
	t.Parallel()
	m := setupMigration(t, 2, 2, nil)
	cfg := m.cfg
	cfg.MaxInFlightRecords = 1
	r := m.start(t, cfg)

	m.writeBatch(t, 20)
	m.request(t, migration.DualWrite, 0)
	after := m.writeBatch(t, 20)
	after = append(after, m.writeTx(t, 30)...)
	m.waitConfirmedPast(t, r, m.walPosition(t), "the DUAL_WRITE step and the 50 events after it")

	wantOld, wantNew := m.expected()
	if len(wantNew) != len(after) {
		t.Fatalf("%d events expected on the new channel, want the %d written after the step", len(wantNew), len(after))
	}
	oldRecs := readAll(t, ferrytest.Client(t, kgo.ConsumeTopics(m.oldTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), wantOld, time.Minute)
	newRecs := readAll(t, ferrytest.ClientB(t, kgo.ConsumeTopics(m.newTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), wantNew, time.Minute)
	nOld := m.checkCopies(t, migration.OldSide, oldRecs)
	nNew := m.checkCopies(t, migration.NewSide, newRecs)
	if nOld != len(after) || nNew != len(after) {
		t.Errorf("stamped copies: %d on the old channel, %d on the new; want %d on each", nOld, nNew, len(after))
	}
	m.checkFences(t, migration.OldSide, oldRecs, 2, []int{1})
	m.checkFences(t, migration.NewSide, newRecs, 2, []int{1})
}

// A relay that stops and starts again routes each event by the step in
// effect at its commit, whether the step was applied before it stopped
// (confirmed), committed while it was down (delivered again by the stream),
// or recorded by a relay that died before confirming it.
func TestRelayResumesWithTheStepInEffectAtItsConfirmedPosition(t *testing.T) {
	t.Parallel()
	m := setupMigration(t, 2, 2, nil)
	cfg := m.cfg
	if err := relay.Setup(m.ctx, m.db.Pool, m.slot, cfg.Publication, nil); err != nil { // the slot sees what commits from now
		t.Fatal(err)
	}
	_, stop := runUntilStopped(t, cfg)
	// waitStreaming writes an event and waits until the slot confirmed it,
	// and so everything written before it, steps included: a relay stopped
	// earlier would leave a step unapplied, which the third phase's forged
	// slot record would then claim was applied.
	waitStreaming := func() {
		t.Helper()
		ids := m.writeBatch(t, 1) // reaches Kafka only once the relay streams
		var written string
		if err := m.db.Pool.QueryRow(m.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&written); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			var done bool
			if err := m.db.Pool.QueryRow(m.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
				m.slot, written).Scan(&done); err != nil {
				t.Fatal(err)
			}
			if done {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the relay confirmed %s, not yet %s, a minute after writing %v", m.confirmed(t), written, ids)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitStreaming()
	m.request(t, migration.DualWrite, 0)
	m.writeBatch(t, 10)
	waitStreaming()
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Down: a step commits between events.
	m.writeBatch(t, 10)
	m.request(t, migration.Cutover, 64)
	m.writeBatch(t, 10)
	_, stop = runUntilStopped(t, cfg)
	waitStreaming()
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Down again: a step commits, and the slot's record says it was
	// applied, as a relay that died between recording a step and
	// confirming it leaves it. The confirmed position is before the step.
	m.writeBatch(t, 10)
	m.request(t, migration.Cutover, migration.Slices)
	var lsn string
	if err := m.db.Pool.QueryRow(m.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	if _, err := m.db.Pool.Exec(m.ctx, `UPDATE ferry_relay_slot
		SET route_steps = route_steps || jsonb_build_object((SELECT max(seq) FROM ferry_migration_step)::text, $2::text)
		WHERE slot_name = $1`, m.slot, lsn); err != nil {
		t.Fatal(err)
	}
	m.writeBatch(t, 10)
	_, stop = runUntilStopped(t, cfg)
	waitStreaming()
	m.writeBatch(t, 10)

	m.checkBothChannels(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A relay may record a step before PostgreSQL holds the confirmation of
// the previous one: it confirms a step's transaction at its next status
// update, and the stream may bring the next step sooner. A crash then
// leaves two recorded steps past the slot's confirmed position (a restart
// of PostgreSQL can move that position back past any number of them:
// TestFaultMigrationStepsAfterPostgresRestart). A relay that resumes there
// routes each event delivered again by the step in effect at its commit,
// and applies each step again at its point. Before, it took the step
// before the last recorded one as in effect, routed the events committed
// before that step by it, and skipped the step when it came.
func TestRelayResumesBeforeTwoRecordedSteps(t *testing.T) {
	t.Parallel()
	m := setupMigration(t, 2, 2, nil)
	held := m.dualWriteConfirmed(t)

	// Down: events under DUAL_WRITE, then two steps, events between them.
	m.writeBatch(t, 10)
	m.request(t, migration.Cutover, 64)
	m.writeBatch(t, 10)
	m.request(t, migration.Cutover, migration.Slices)
	last := m.writeBatch(t, 10)

	// A relay applies and records both steps, and PostgreSQL hears of
	// none of it: the slot stays before the first step.
	m.relayUnheard(t, held, last)

	r, stop := runUntilStopped(t, m.cfg)
	m.waitConfirmedPast(t, r, m.walPosition(t), "both steps and the events around them")
	m.writeBatch(t, 16) // after every copy delivered again, on every partition

	m.checkBothChannels(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A relay that takes over a slot routes by the step in effect where the
// server starts its stream, though the slot moved after the relay looked
// at it: the last status update of the relay it takes over from (a
// standby's predecessor, the old process of a rolling restart) can confirm
// a step that relay recorded, after the taker read the slot's position and
// before its START_REPLICATION. Before, the taker took the position it had
// read for its start, put the step before that one in effect, and stamped
// the events after the step with the previous one.
func TestRelayTakingOverRoutesByTheStepWhereItsStreamStarts(t *testing.T) {
	t.Parallel()
	m := setupMigration(t, 2, 2, nil)
	held := m.dualWriteConfirmed(t)

	// The relay taken over applies and records a step, and the status
	// update that confirms it is still on its way.
	m.writeBatch(t, 10)
	m.request(t, migration.Cutover, 64)
	last := m.writeBatch(t, 10)
	m.relayUnheard(t, held, last)
	h := m.stepHistory(t)
	stepLSN := h[len(h)-1][strings.Index(h[len(h)-1], "@")+1:] // where CUTOVER 64 is in effect from

	// The taker reads the slot at held; the update lands before its
	// START_REPLICATION, and the server starts the stream after the step.
	var once sync.Once
	advanced := make(chan string, 1) // where the slot was moved to
	takerCfg := m.cfg
	relay.BeforeStartReplication(&takerCfg, func() {
		once.Do(func() {
			deadline := time.Now().Add(time.Minute)
			for { // once the walsender of the relay taken over let the slot go
				var moved string
				err := m.db.Pool.QueryRow(m.ctx, `SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::pg_lsn)`,
					m.slot, stepLSN).Scan(&moved)
				if err == nil || time.Now().After(deadline) {
					if err != nil {
						t.Errorf("advance the slot to %s: %v", stepLSN, err)
					}
					advanced <- moved
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	})
	r, stop := runUntilStopped(t, takerCfg)
	m.writeBatch(t, 10)
	m.waitConfirmedPast(t, r, m.walPosition(t), "10 events after the takeover")
	select {
	case moved := <-advanced:
		if moved != stepLSN {
			t.Fatalf("the slot moved to %q before the taker's START_REPLICATION, want %s (steps %v)", moved, stepLSN, h)
		}
	default:
		t.Fatal("the taker streams, and it never called the hook before its START_REPLICATION")
	}

	m.checkBothChannels(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// dualWriteConfirmed runs a relay on a new slot through the DUAL_WRITE
// step and 10 events, stops it once the slot confirmed them, and returns
// the slot's confirmed position.
func (m *migrationBundle) dualWriteConfirmed(t *testing.T) string {
	t.Helper()
	if err := relay.Setup(m.ctx, m.db.Pool, m.slot, m.cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	r, stop := runUntilStopped(t, m.cfg)
	m.request(t, migration.DualWrite, 0)
	m.writeBatch(t, 10)
	m.waitConfirmedPast(t, r, m.walPosition(t), "the DUAL_WRITE step and 10 events")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return m.confirmed(t)
}

// relayUnheard runs a relay whose status updates PostgreSQL never hears
// past held until the new channel has every event of last, then stops it:
// the relay applied and recorded every step before them, and the slot
// stays at held.
func (m *migrationBundle) relayUnheard(t *testing.T, held string, last []string) {
	t.Helper()
	cfg := m.cfg
	if err := relay.HoldConfirmedFlush(&cfg, held); err != nil {
		t.Fatal(err)
	}
	_, stop := runUntilStopped(t, cfg)
	readAll(t, ferrytest.ClientB(t, kgo.ConsumeTopics(m.newTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), last, time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := m.confirmed(t); got != held {
		t.Fatalf("the slot confirmed %s, want it held at %s", got, held)
	}
}

// stepHistory is the slot's recorded steps, oldest first: seq@lsn.
func (m *migrationBundle) stepHistory(t *testing.T) []string {
	t.Helper()
	rows, err := m.db.Pool.Query(m.ctx, `SELECT e.key || '@' || e.value FROM ferry_relay_slot s, jsonb_each_text(s.route_steps) e
		WHERE s.slot_name = $1 ORDER BY e.key::bigint`, m.slot)
	if err != nil {
		t.Fatal(err)
	}
	h, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A slot forgets the steps no resume can need: a session that starts
// keeps the one in effect at the slot's restart_lsn, before which
// PostgreSQL never resumes, and those after it.
func TestRelayForgetsTheStepsBeforeTheSlotsRestartLSN(t *testing.T) {
	t.Parallel()
	m := setupMigration(t, 2, 2, nil)
	cfg := m.cfg
	if err := relay.Setup(m.ctx, m.db.Pool, m.slot, cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	r, stop := runUntilStopped(t, cfg)
	m.request(t, migration.DualWrite, 0)
	m.writeBatch(t, 5)
	m.request(t, migration.Cutover, 64)
	m.writeBatch(t, 5)
	var beforeLast string // past the end of every step but the last
	if err := m.db.Pool.QueryRow(m.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&beforeLast); err != nil {
		t.Fatal(err)
	}
	m.request(t, migration.Cutover, migration.Slices)
	m.writeBatch(t, 5)
	m.waitConfirmedPast(t, r, m.walPosition(t), "three steps")
	if h := m.stepHistory(t); len(h) != 4 {
		t.Fatalf("slot's steps %v, want the one at its start and the three applied", h)
	}

	// The slot's restart_lsn moves past the steps once the relay
	// confirms past a record of the running transactions (a checkpoint
	// writes one) that names none older.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var past bool
		if err := m.db.Pool.QueryRow(m.ctx, `SELECT restart_lsn > $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
			m.slot, beforeLast).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if past {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot's restart_lsn is not past %s after two minutes of checkpoints", beforeLast)
		}
		if _, err := m.db.Pool.Exec(m.ctx, `CHECKPOINT`); err != nil {
			t.Fatal(err)
		}
		m.writeBatch(t, 1)
		m.waitConfirmedPast(t, r, m.walPosition(t), "an event after a checkpoint")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	before := m.stepHistory(t)
	// A session forgets steps only while no walsender holds the slot (the
	// stopped relay's may still be on its way out).
	deadline = time.Now().Add(time.Minute)
	for {
		var active bool
		if err := m.db.Pool.QueryRow(m.ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, m.slot).Scan(&active); err != nil {
			t.Fatal(err)
		}
		if !active {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slot is still active a minute after the relay stopped")
		}
		time.Sleep(20 * time.Millisecond)
	}

	r, stop = runUntilStopped(t, cfg)
	waitState(t, r, relay.StateStreaming)
	after := m.stepHistory(t)
	// Kept: the step in effect at restart_lsn (the last or the one before)
	// and those after it.
	if len(after) == 0 || len(after) > 2 || after[len(after)-1] != before[len(before)-1] {
		t.Fatalf("the slot's steps went from %v to %v; want the last two at most, the newest kept", before, after)
	}
	m.writeBatch(t, 16)
	m.checkBothChannels(t)
	t.Logf("the slot's steps went from %v to %v", before, after)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// While dual-writing, a transaction is confirmed only when both channels
// acknowledged it: with the new channel unreachable, the relay waits in
// place to fence the new channel's topics when the step applies (not
// ready, saying why). When the plan's new channel is then pointed at a
// cluster that answers, a restarted relay delivers every event's copies on
// both channels: nothing was confirmed past them.
func TestDualWriteConfirmsOnlyWhatBothChannelsAcknowledged(t *testing.T) {
	t.Parallel()
	m := setupMigration(t, 1, 1, []string{"127.0.0.1:1"})
	cfg := m.cfg
	cfg.ShutdownTimeout = time.Second
	if err := relay.Setup(m.ctx, m.db.Pool, m.slot, cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	r, stop := runUntilStopped(t, cfg)
	m.request(t, migration.DualWrite, 0)
	m.writeBatch(t, 5)
	deadline := time.Now().Add(time.Minute)
	for {
		err := r.Ready()
		if err != nil && strings.Contains(err.Error(), "the new channel does not answer") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v, want the new channel named as what the relay waits for", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	if _, err := m.db.Pool.Exec(m.ctx, `UPDATE ferry_migration SET new_channel = jsonb_set(new_channel, '{brokers}', to_jsonb($1::text[]))`,
		ferrytest.BrokersB(t)); err != nil {
		t.Fatal(err)
	}
	_, stop = runUntilStopped(t, cfg)
	m.checkBothChannels(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// Abandoning is the way out when the new channel is down, so it takes
// effect at once: with the new channel unreachable the relay waits in place
// (nothing confirmed past the dual-written events); once OLD_ONLY is
// committed it gives up the copies pending there (shadows: the old copy is
// authoritative in DUAL_WRITE), delivers every event to the old channel,
// confirms past the abandon and is ready again, the new channel still
// down. Before, it waited for the new channel for good.
func TestAbandonTakesEffectWhileTheNewChannelIsDown(t *testing.T) {
	t.Parallel()
	m := setupMigration(t, 1, 1, []string{"127.0.0.1:1"})
	cfg := m.cfg
	cfg.ShutdownTimeout = time.Second
	if err := relay.Setup(m.ctx, m.db.Pool, m.slot, cfg.Publication, nil); err != nil {
		t.Fatal(err)
	}
	r, stop := runUntilStopped(t, cfg)
	defer stop()
	m.request(t, migration.DualWrite, 0)
	m.writeBatch(t, 5)
	waitReady(t, r, "the new channel does not answer")
	m.request(t, migration.OldOnly, 0)
	m.writeBatch(t, 5)
	var end string
	if err := m.db.Pool.QueryRow(m.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	wantOld, _ := m.expected()
	oldRecs := readAll(t, ferrytest.Client(t, kgo.ConsumeTopics(m.oldTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())), wantOld, time.Minute)
	m.checkCopies(t, migration.OldSide, oldRecs)
	waitReady(t, r, "")
	deadline := time.Now().Add(time.Minute)
	for {
		var past bool
		if err := m.db.Pool.QueryRow(m.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
			m.slot, end).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if past {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot's confirmed position %s is not past %s, the end of the events after the abandon", m.confirmed(t), end)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A recovery republishes to the relay's own channel only, so it refuses
// while a plan writes two channels, naming the plan and the way out.
func TestRecoverRefusesDuringAMigration(t *testing.T) {
	t.Parallel()
	m := setupMigration(t, 1, 1, nil)
	m.request(t, migration.DualWrite, 0)
	r, err := relay.New(&m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Recover(m.ctx, &relay.RecoverOpts{Since: time.Now().Add(-time.Hour)})
	if err == nil || !strings.Contains(err.Error(), `plan "move" is in DUAL_WRITE`) || !strings.Contains(err.Error(), "OLD_ONLY") {
		t.Fatalf("Recover during a migration = %v, want a refusal naming the plan and OLD_ONLY", err)
	}
	if exists, err := m.db.Pool.Query(m.ctx, `SELECT 1 FROM pg_replication_slots WHERE slot_name = $1`, m.slot); err != nil {
		t.Fatal(err)
	} else if exists.Next() {
		exists.Close()
		t.Fatal("the refused recovery created a slot")
	} else {
		exists.Close()
	}
}
