package faults

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/migration"
)

// MigrationFaults are the kinds RunMigration injects: kills of the relay
// and of a worker, and either broker stopped.
var MigrationFaults = []FaultKind{FaultRelayKill, FaultWorkerKill, FaultKafkaStop, FaultKafkaBStop}

// MigrationFigures is what a migration run adds to its report.
type MigrationFigures struct {
	Plan string
	// Asked is every request the run made, in order, with the answer it
	// got; Recorded the rows of ferry_migration_request.
	Asked    []AskedRequest
	Recorded int
	// Unrecorded requests have no row, or a row with another answer;
	// ForbiddenAccepted forbidden requests the controller accepted. M4
	// wants 0 of each.
	Unrecorded, ForbiddenAccepted int
	// FinalPhase is where the plan ended: OLD_RETIRED when the run went
	// through.
	FinalPhase string
	// NewRecords and NewDistinct are the records on the new channel's topic
	// and the distinct ids among them.
	NewRecords, NewDistinct int64
}

// AskedRequest is one request of the run.
type AskedRequest struct {
	At        time.Duration
	To        string
	Slices    int
	Forbidden bool // the run asks it knowing it must be rejected
	Accepted  bool
	ID        int64
	Reason    string
}

// poisonAccepted is the migration runs' --max-old-dead-letters: the
// poison events the load writes stay dead letters by design, and a run
// accepts them where they are. (The drain's refusal over dead letters is
// tested in package inbox.)
const poisonAccepted = 1 << 20

// scriptStep is one request of a run's script.
type scriptStep struct {
	to        migration.Phase
	slices    int
	forbidden bool // the run asks it knowing it must be rejected
	gated     bool // retried until a gate lets it through
}

// migrationScript is the plan the run drives: every phase, slice steps, a
// rollback drill and the retirement, with forbidden requests among them.
var migrationScript = []scriptStep{
	{migration.OldRetired, 0, true, false}, // from OLD_ONLY: forbidden
	{migration.DualWrite, 0, false, false},
	{migration.OldRetired, 0, true, false}, // from DUAL_WRITE: forbidden
	{migration.Cutover, 6, false, true},    // the shadow gate
	{migration.Cutover, 32, false, false},
	{migration.Cutover, 0, true, false}, // fewer slices: rejected
	{migration.DualWrite, 0, false, false},
	{migration.Cutover, 64, false, true},
	{migration.Cutover, migration.Slices, false, false},
	{migration.OldRetired, 0, false, true}, // the drain
}

// RunMigration is the suite with a live broker migration: while the load
// runs and the injector kills the relay and a worker and stops either
// broker, a controller moves the plan from cluster A (the relay's channel)
// to cluster B (another topic template, more partitions) through every
// phase, slice steps, a rollback drill and the retirement, with forbidden
// requests among them. The checker holds the run to M1 (one effect per
// event and consumer), M2 (final state), M3 (every event without an effect
// quarantined or dead-lettered, the migration's quarantine included), M4
// (every request recorded with its answer, the forbidden ones rejected),
// per-aggregate order, and the plan ending in OLD_RETIRED.
func RunMigration(ctx context.Context, o Options) (*Report, error) {
	if len(o.Kinds) == 0 {
		o.Kinds = MigrationFaults
	}
	p, stack, err := open(ctx, &o, "migration")
	var rep *Report
	if p != nil {
		defer func() { p.close(o.Keep || rep == nil || !rep.OK()) }()
	}
	if err != nil {
		return nil, err
	}
	r := p.newReport("Live broker migration under faults", stack)
	plan, err := p.openNewChannel(ctx, stack)
	if err != nil {
		return nil, err
	}
	// Outages of 10-20 s and restarts put one channel's consumers minutes
	// behind the other's: the delay between copies the gate accepts here.
	// The suite's poison events stay dead letters on purpose (the checker
	// accounts for them): the operator accepts them on the old channel.
	ctl := &migration.Controller{DB: p.pool, Evidence: &migration.ReportEvidence{MaxP99Lateness: 5 * time.Minute, MaxAge: time.Minute,
		MaxOldDeadLetters: poisonAccepted}}
	if err := ctl.Create(ctx, plan, "faults"); err != nil {
		return nil, err
	}
	m := &MigrationFigures{Plan: plan.Name}
	r.Migration = m

	if err := p.startRelay(ctx); err != nil {
		return nil, err
	}
	workerArgs := func(i int) []string {
		return append(o.WorkerArgs(i), "--migration-report-interval", "1s")
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
	p.logf("relay, %d workers and the load generator started; plan %s from cluster A to B", o.Workers, plan.Name)

	var wg sync.WaitGroup
	var scriptErr error
	wg.Go(func() { scriptErr = p.runScript(ctx, ctl, m, migrationScript) })
	in := newInjector(p, o.Seed)
	injErr := in.run(ctx, o.Kinds, p.load.Done())
	r.Faults = in.Faults()
	wg.Wait()
	if injErr != nil {
		return nil, injErr
	}
	if scriptErr != nil {
		return nil, scriptErr
	}
	if err := p.waitLoad(ctx, r); err != nil {
		return nil, err
	}
	if err := p.finish(ctx, r); err != nil {
		return nil, err
	}
	if err := p.checkMigration(ctx, ctl, m); err != nil {
		return nil, err
	}
	rep = r
	return rep, nil
}

// openNewChannel creates the run's topics on cluster B and returns the
// plan that moves the run from cluster A to them (another topic template,
// more partitions), not yet created.
func (p *pipeline) openNewChannel(ctx context.Context, stack *Stack) (migration.Plan, error) {
	if len(stack.BrokersB) == 0 {
		return migration.Plan{}, errors.New("a migration run needs the stack's cluster B (scripts/stack starts it unless FERRY_STACK_KAFKA_B=0)")
	}
	var err error
	if p.kclB, err = kgo.NewClient(kgo.SeedBrokers(stack.BrokersB...)); err != nil {
		return migration.Plan{}, err
	}
	p.admB = kadm.NewClient(p.kclB)
	p.newTopic = "faultsb." + p.name + "." + AggregateType
	p.newDL = p.newTopic + ".dlq"
	maxBytes := strconv.Itoa(p.o.TopicMaxMessageBytes)
	for _, t := range []struct {
		name       string
		partitions int32
		configs    map[string]*string
	}{{p.newTopic, int32(p.o.Partitions + 4), map[string]*string{"max.message.bytes": &maxBytes}}, {p.newDL, 2, nil}} {
		res, err := p.admB.CreateTopic(ctx, t.partitions, 1, t.configs, t.name)
		if err == nil {
			err = res.Err
		}
		if err != nil {
			return migration.Plan{}, fmt.Errorf("create %s on cluster B: %w", t.name, err)
		}
	}
	return migration.Plan{Name: "move-" + p.name,
		Old:    migration.Channel{Brokers: stack.Brokers, TopicTemplate: "faults." + p.name + ".{aggregate_type}"},
		New:    migration.Channel{Brokers: stack.BrokersB, TopicTemplate: "faultsb." + p.name + ".{aggregate_type}"},
		Groups: p.consumers}, nil
}

// runScript asks script's requests, spread over the load.
func (p *pipeline) runScript(ctx context.Context, ctl *migration.Controller, m *MigrationFigures, script []scriptStep) error {
	gap := p.o.LoadDuration / time.Duration(len(script)+2)
	if err := sleep(ctx, p.o.Warmup); err != nil {
		return err
	}
	for _, s := range script {
		if _, err := p.ask(ctx, ctl, m, s); err != nil {
			return err
		}
		if err := sleep(ctx, gap); err != nil {
			return err
		}
	}
	return nil
}

// ask asks one request and records it in m; a gated one is asked again
// every second until accepted (each refusal recorded too), for at most two
// minutes. An error is a request that could not be asked, or one refused
// that the script wanted accepted.
func (p *pipeline) ask(ctx context.Context, ctl *migration.Controller, m *MigrationFigures, s scriptStep) (*migration.Decision, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var d *migration.Decision
		err := retry(ctx, func(ctx context.Context) error {
			var err error
			d, err = ctl.Request(ctx, m.Plan, s.to, s.slices, "faults")
			return err
		})
		if err != nil {
			return nil, err
		}
		m.Asked = append(m.Asked, AskedRequest{At: time.Since(p.t0), To: string(s.to), Slices: s.slices, Forbidden: s.forbidden,
			Accepted: d.Accepted, ID: d.ID, Reason: d.Reason})
		if d.Accepted || s.forbidden {
			p.logf("migration: %s %d %s: %s", s.to, s.slices, map[bool]string{true: "accepted", false: "rejected"}[d.Accepted], d.Reason)
			return d, nil
		}
		if !s.gated || time.Now().After(deadline) {
			return d, fmt.Errorf("migration: %s %d rejected: %s", s.to, s.slices, d.Reason)
		}
		if err := sleep(ctx, time.Second); err != nil {
			return d, err
		}
	}
}

// checkMigration holds the run to M4 and reads the new channel's topic.
func (p *pipeline) checkMigration(ctx context.Context, ctl *migration.Controller, m *MigrationFigures) error {
	hist, err := ctl.History(ctx, m.Plan)
	if err != nil {
		return err
	}
	m.Recorded = len(hist)
	byID := map[int64]migration.Decision{}
	for _, d := range hist {
		byID[d.ID] = d
	}
	for _, a := range m.Asked {
		d, ok := byID[a.ID]
		if !ok || d.Accepted != a.Accepted || string(d.To) != a.To || d.ToSlices != a.Slices {
			m.Unrecorded++
		}
		if a.Forbidden && a.Accepted {
			m.ForbiddenAccepted++
		}
	}
	st, err := ctl.State(ctx, m.Plan)
	if err != nil {
		return err
	}
	m.FinalPhase = string(st.Phase)
	m.NewRecords, m.NewDistinct, err = p.scanTopicOn(ctx, p.admB, p.kclB.Opts(), p.newTopic)
	return err
}

// violations are the migration's broken invariants.
func (m *MigrationFigures) violations() []string {
	var v []string
	if m.Unrecorded > 0 {
		v = append(v, fmt.Sprintf("%d migration requests not recorded with the answer they got (M4)", m.Unrecorded))
	}
	if m.ForbiddenAccepted > 0 {
		v = append(v, fmt.Sprintf("%d forbidden migration requests accepted (M4)", m.ForbiddenAccepted))
	}
	if m.FinalPhase != string(migration.OldRetired) {
		v = append(v, fmt.Sprintf("the plan ended in %s, not %s", m.FinalPhase, migration.OldRetired))
	}
	if m.NewDistinct == 0 {
		v = append(v, "nothing reached the new channel")
	}
	return v
}
