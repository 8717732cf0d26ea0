package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/migration"
)

// LossyFigures is what a run over a lossy new channel (RunLossyMigration)
// adds to its report.
type LossyFigures struct {
	// Safe runs keep the drain and the quarantine; the negative control
	// retires the old channel at cutover with neither.
	Safe bool
	// Dropped are the events whose authoritative copy the relay's lossy
	// new channel acknowledged without writing it (distinct ids).
	Dropped int
	// Consumers are the per-consumer findings, in the run's order.
	Consumers []LossyConsumer
	// RetireRefusals are the answers to OLD_RETIRED requests refused
	// because of the quarantine, before the replay (safe runs).
	RetireRefusals []string
	// RetireEarly is set when OLD_RETIRED was accepted while dropped
	// events waited in a quarantine: the drain let a loss through.
	RetireEarly bool
}

// LossyConsumer is one consumer's account of the dropped events.
type LossyConsumer struct {
	Consumer string
	// Quarantined are the dropped events found in the consumer's migration
	// quarantine before the replay; NotQuarantined the others. Replayed
	// counts the events replayed from it (the dropped ones, and any late
	// copy quarantined meanwhile).
	Quarantined, NotQuarantined, Replayed int
	// LostDropped are the checker's lost events that the channel dropped;
	// LostOther the lost events it did not drop.
	LostDropped, LostOther int
}

// violations are the lossy run's broken promises (safe runs only: the
// control is meant to lose).
func (l *LossyFigures) violations() []string {
	if !l.Safe {
		return nil
	}
	var v []string
	if l.Dropped == 0 {
		v = append(v, "the lossy channel dropped nothing: the quarantine went untested")
	}
	for _, c := range l.Consumers {
		if c.NotQuarantined > 0 {
			v = append(v, fmt.Sprintf("%s: %d events the new channel dropped were never quarantined (M3)", c.Consumer, c.NotQuarantined))
		}
	}
	if l.RetireEarly {
		v = append(v, "OLD_RETIRED was accepted while dropped events waited in the quarantine")
	} else if len(l.RetireRefusals) == 0 {
		v = append(v, "no OLD_RETIRED request was refused for the quarantine: the refusal went untested")
	}
	return v
}

// LossyOptions derives the lossy runs' options from a run's: no fault
// injected, a short load, no oversized event (the relay's quarantine is
// not what these runs check).
func LossyOptions(o Options) Options {
	c := o
	c.Events, c.LoadDuration = 6000, 20*time.Second
	c.HugeEvery = 0
	c.Warmup = 4 * time.Second
	c.DrainTimeout = 2 * time.Minute
	return c
}

// lossyPercent is the share of the new channel's authoritative copies the
// relay drops in the lossy runs (seed 002's 1%).
const lossyPercent = 1

// lossyScript moves every slice, rehearses the rollback and moves them
// again: the drops happen while the slices are on the new channel.
var lossyScript = []scriptStep{
	{migration.DualWrite, 0, false, false},
	{migration.Cutover, migration.Slices, false, true},
	{migration.DualWrite, 0, false, false},
	{migration.Cutover, migration.Slices, false, true},
}

// RunLossyMigration is seed 002's lossy channel: the relay (built with the
// ferryfault tag) drops 1% of the authoritative copies it writes to the
// new channel while their shadow is on the old one, and says nothing.
//
// The negative control (safe false) then retires the old channel at
// cutover with no drain: the controller's evidence says yes to everything
// and the workers never quarantine. The dropped events are lost without a
// trace, and the checker must report exactly them lost
// (Report.ControlCaught, LossyConsumer.LostDropped).
//
// The safe run (safe true) keeps the gates and the quarantine: every
// dropped event must reach every consumer's quarantine, OLD_RETIRED must
// be refused while they wait there, and after the replay nothing is lost,
// nothing applied twice. A lost event breaks its aggregate's order (the
// next version applies after a gap, the replayed one last): the checker
// counts those aggregates apart (ConsumerFigures.LossyOrder); every other
// aggregate keeps its order.
func RunLossyMigration(ctx context.Context, o Options, safe bool) (*Report, error) {
	name := "lossyctl"
	if safe {
		name = "lossy"
	}
	p, stack, err := open(ctx, &o, name)
	var rep *Report
	if p != nil {
		defer func() { p.close(o.Keep || (safe && (rep == nil || !rep.OK()))) }()
	}
	if err != nil {
		return nil, err
	}
	title := "Negative control: a new channel that drops 1%, the old one retired at cutover with no drain and no quarantine"
	if safe {
		title = "A new channel that drops 1%, with the drain and the quarantine"
	}
	r := p.newReport(title, stack)
	plan, err := p.openNewChannel(ctx, stack)
	if err != nil {
		return nil, err
	}
	ctl := &migration.Controller{DB: p.pool, Evidence: yesEvidence{}, Getenv: p.getenv}
	if safe {
		ctl.Evidence = &migration.ReportEvidence{MaxP99Lateness: time.Minute, MaxAge: 30 * time.Second, MaxOldDeadLetters: poisonAccepted,
			Getenv: p.getenv}
	}
	if err := ctl.Create(ctx, plan, "faults"); err != nil {
		return nil, err
	}
	m := &MigrationFigures{Plan: plan.Name}
	l := &LossyFigures{Safe: safe}
	r.Migration, r.Lossy = m, l

	p.relayEnv = []string{fmt.Sprintf("FERRY_FAULT_DROP_NEW_PERCENT=%d", lossyPercent)}
	if err := p.startRelay(ctx); err != nil {
		return nil, err
	}
	workerArgs := func(i int) []string {
		args := append(o.WorkerArgs(i), append(oldQuietArgs(o), "--migration-report-interval", "1s", "--migration-allowed-lateness", "2s")...)
		if !safe {
			return append(args, "--unsafe-no-migration-quarantine")
		}
		return append(args, "--migration-quarantine-after", "10s")
	}
	if err := p.startWorkers(ctx, o.Workers, workerArgs); err != nil {
		return nil, err
	}
	sctx, stopScrape := context.WithCancel(ctx)
	defer stopScrape()
	go p.scrapeLoop(sctx)
	if err := p.startLoad(o.Events, o.LoadDuration); err != nil {
		return nil, err
	}
	p.logf("relay (dropping %d%% of the new channel's authoritative copies), %d workers and the load started; plan %s", lossyPercent, o.Workers, plan.Name)
	script := lossyScript
	if !safe {
		script = append(slices.Clone(lossyScript), scriptStep{to: migration.OldRetired})
	}
	if err := p.runScript(ctx, ctl, m, script); err != nil {
		return nil, err
	}
	if err := p.waitLoad(ctx, r); err != nil {
		return nil, err
	}
	if safe {
		if err := p.quarantineAndRetire(ctx, ctl, m, l); err != nil {
			return nil, err
		}
	} else if _, _, err := p.drain(ctx, o.DrainTimeout); err != nil {
		return nil, err
	}
	if err := p.readDropped(ctx, l); err != nil {
		return nil, err
	}
	if err := p.finish(ctx, r); err != nil {
		return nil, err
	}
	if err := p.checkMigration(ctx, ctl, m); err != nil {
		return nil, err
	}
	dropped, err := p.droppedIDs()
	if err != nil {
		return nil, err
	}
	for i, c := range r.Consumers {
		lc := &l.Consumers[i]
		for _, id := range c.lost {
			if dropped[id] {
				lc.LostDropped++
			} else {
				lc.LostOther++
			}
		}
	}
	rep = r
	return rep, nil
}

// quarantineAndRetire is the safe run's end: once the pipeline drained,
// it waits for every dropped event in every consumer's quarantine, asks
// OLD_RETIRED (which must be refused for the quarantine), replays the
// quarantine and asks OLD_RETIRED again until the drain lets it through.
func (p *pipeline) quarantineAndRetire(ctx context.Context, ctl *migration.Controller, m *MigrationFigures, l *LossyFigures) error {
	if _, ok, err := p.drain(ctx, p.o.DrainTimeout); err != nil || !ok {
		return errors.Join(err, errors.New("the lossy run did not drain before the retirement"))
	}
	if p.o.MigrateTo == BrokerRabbitMQ {
		if err := p.stepBackAndForth(ctx, ctl, m, l); err != nil {
			return err
		}
	}
	if err := p.readDropped(ctx, l); err != nil {
		return err
	}
	dropped, err := p.droppedIDs()
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(dropped))
	for id := range dropped {
		ids = append(ids, id.String())
	}
	// A shadow is quarantined --migration-quarantine-after (10 s) after it
	// arrived, at the next report (1 s).
	deadline := time.Now().Add(time.Minute)
	for i, g := range p.consumers {
		for {
			var n int
			if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM ferry_inbox_quarantine WHERE consumer = $1 AND message_id = ANY($2)`,
				g, ids).Scan(&n); err != nil {
				return err
			}
			l.Consumers[i].Quarantined, l.Consumers[i].NotQuarantined = n, len(ids)-n
			if n == len(ids) || time.Now().After(deadline) {
				break
			}
			if err := sleep(ctx, 500*time.Millisecond); err != nil {
				return err
			}
		}
		p.logf("lossy: %s quarantined %d of the %d dropped events", g, l.Consumers[i].Quarantined, len(ids))
	}
	// The drain must refuse while the quarantine is not empty: ask until a
	// fresh report shows it (the refusal names the quarantine), or until
	// accepted, which is the failure this run exists to catch.
	for range 30 {
		d, err := p.ask(ctx, ctl, m, scriptStep{to: migration.OldRetired, forbidden: true})
		if err != nil {
			return err
		}
		if d.Accepted {
			l.RetireEarly = true
			break
		}
		if strings.Contains(d.Reason, "quarantine") {
			l.RetireRefusals = append(l.RetireRefusals, d.Reason)
			break
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
	// The shadows are on the old channel: the replay goes back there.
	replay := func(q inbox.MigrationQuarantined) error {
		return inbox.ReplayMigrationQuarantined(ctx, p.pool, []kgo.Opt{kgo.SeedBrokers(p.stack.Brokers...)}, q)
	}
	if p.o.rabbit() {
		replay = func(q inbox.MigrationQuarantined) error {
			return inbox.ReplayMigrationQuarantinedRabbitMQ(ctx, p.pool, p.rabbitConfig(), q)
		}
	}
	for i, g := range p.consumers {
		qs, err := inbox.ListMigrationQuarantined(ctx, p.pool, g)
		if err != nil {
			return err
		}
		for _, q := range qs {
			err := replay(q)
			if errors.Is(err, inbox.ErrNoLongerQuarantined) {
				continue // the replay of another consumer's copy reached this one
			}
			if err != nil {
				return err
			}
			l.Consumers[i].Replayed++
		}
		p.logf("lossy: replayed %d quarantined events of %s", l.Consumers[i].Replayed, g)
	}
	if l.RetireEarly {
		return nil
	}
	_, err = p.ask(ctx, ctl, m, scriptStep{to: migration.OldRetired, gated: true})
	return err
}

// stepBackAndForth is the way out docs/migration.md gives when the new
// channel is RabbitMQ, where a worker cannot read its group's position:
// the shadows of the copies dropped since the last step wait, counted
// unwatched, and OLD_RETIRED must be refused (for them, or first for the
// quarantine of those dropped before); stepping back to DUAL_WRITE and on
// to CUTOVER 128 writes fences behind which the lost copies never came,
// and the workers quarantine their shadows.
func (p *pipeline) stepBackAndForth(ctx context.Context, ctl *migration.Controller, m *MigrationFigures, l *LossyFigures) error {
	// A shadow counts unwatched --migration-quarantine-after (10 s) after
	// it arrived, at the next report (1 s).
	deadline := time.Now().Add(time.Minute)
	for {
		d, err := p.ask(ctx, ctl, m, scriptStep{to: migration.OldRetired, forbidden: true})
		if err != nil {
			return err
		}
		if d.Accepted {
			l.RetireEarly = true
			return nil
		}
		// The drain names the quarantine first: the copies dropped before
		// the last step are there already (its fences showed them lost).
		if strings.Contains(d.Reason, "shadow copies wait") || strings.Contains(d.Reason, "migration quarantine") {
			l.RetireRefusals = append(l.RetireRefusals, d.Reason)
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("OLD_RETIRED was never refused for the dropped copies' shadows; last: %s", d.Reason)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
	for _, s := range []scriptStep{{to: migration.DualWrite}, {to: migration.Cutover, slices: migration.Slices, gated: true}} {
		if _, err := p.ask(ctx, ctl, m, s); err != nil {
			return err
		}
	}
	return nil
}

// readDropped reads the ids the relay's lossy channel dropped from its log,
// and the aggregates they belong to (whose order the checker holds apart).
func (p *pipeline) readDropped(ctx context.Context, l *LossyFigures) error {
	dropped, err := p.droppedIDs()
	if err != nil {
		return err
	}
	l.Dropped = len(dropped)
	ids := make([]uuid.UUID, 0, len(dropped))
	for id := range dropped {
		ids = append(ids, id)
	}
	rows, err := p.pool.Query(ctx, `SELECT DISTINCT aggregate_id FROM outbox WHERE id = ANY($1)`, ids)
	if err != nil {
		return err
	}
	defer rows.Close()
	p.lossyAggregates = p.lossyAggregates[:0]
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			return err
		}
		p.lossyAggregates = append(p.lossyAggregates, a)
	}
	if l.Consumers == nil {
		for _, g := range p.consumers {
			l.Consumers = append(l.Consumers, LossyConsumer{Consumer: g})
		}
	}
	return rows.Err()
}

// droppedIDs parses the relay's log for its "ferryfault: dropped" lines.
func (p *pipeline) droppedIDs() (map[uuid.UUID]bool, error) {
	f, err := os.Open(p.relay.LogFile())
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[uuid.UUID]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), "ferryfault: dropped") {
			continue
		}
		var e struct {
			Msg string `json:"msg"`
			ID  string `json:"id"`
		}
		if err := json.Unmarshal(line, &e); err != nil || e.Msg != "ferryfault: dropped" {
			continue
		}
		id, err := uuid.Parse(e.ID)
		if err != nil {
			return nil, fmt.Errorf("relay log: dropped id %q: %w", e.ID, err)
		}
		out[id] = true
	}
	return out, sc.Err()
}

// yesEvidence passes every gate: the negative control's controller, which
// retires the old channel without a drain.
type yesEvidence struct{}

func (yesEvidence) ShadowGate(context.Context, migration.Plan, string) error { return nil }

func (yesEvidence) Drained(context.Context, migration.Plan, string, int) error { return nil }
