package faults

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
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

// MigrationFaultsOf are MigrationFaults for a run from o.Broker to
// o.MigrateTo: the relay, a worker, and each channel's broker stopped.
func MigrationFaultsOf(o Options) []FaultKind {
	stop := func(kind string, kafka FaultKind) FaultKind {
		if kind == BrokerRabbitMQ {
			return FaultRabbitMQStop
		}
		return kafka
	}
	return []FaultKind{FaultRelayKill, FaultWorkerKill, stop(o.Broker, FaultKafkaStop), stop(o.MigrateTo, FaultKafkaBStop)}
}

// rabbitPasswordEnv names the variable that holds the stack's RabbitMQ
// password in a migration plan's RabbitMQ channel: set for the relay, the
// workers, the bridge and the controller.
const rabbitPasswordEnv = "FERRY_FAULTS_RABBITMQ_PASSWORD"

// MigrationFigures is what a migration run adds to its report.
type MigrationFigures struct {
	Plan string
	// Route says from where to where ("cluster A to B", "RabbitMQ to
	// cluster B"); NewKind is the new channel's kind.
	Route, NewKind string
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
	// and the distinct ids among them (on RabbitMQ, which cannot be read
	// again, the copies the workers recorded from it).
	NewRecords, NewDistinct int64
	// ForeignPublished is what the producer that is not Ferry's published
	// to the old channel (Options.Foreign); ForeignCopies the distinct
	// messages of it whose bridged copy the workers recorded.
	ForeignPublished, ForeignCopies int64
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
		o.Kinds = MigrationFaultsOf(o)
	}
	if o.Broker == BrokerRabbitMQ && o.MigrateTo == BrokerRabbitMQ {
		return nil, errors.New("faults: a migration run goes from RabbitMQ to Kafka, from Kafka to RabbitMQ, or between Kafka clusters")
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
		MaxOldDeadLetters: poisonAccepted, Getenv: p.getenv}, Getenv: p.getenv}
	if err := ctl.Create(ctx, plan, "faults"); err != nil {
		return nil, err
	}
	m := &MigrationFigures{Plan: plan.Name, Route: migrationRoute(o), NewKind: cmp.Or(o.MigrateTo, BrokerKafka)}
	r.Migration = m

	if o.Foreign > 0 {
		// Before DUAL_WRITE, so that its queues keep what the foreign
		// producer publishes from then on.
		if err := p.startBridge(ctx, plan.Name); err != nil {
			return nil, err
		}
	}
	if err := p.startRelay(ctx); err != nil {
		return nil, err
	}
	workerArgs := func(i int) []string {
		return append(o.WorkerArgs(i), append(oldQuietArgs(o), "--migration-report-interval", "1s")...)
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
	var foreign *foreignProducer
	if o.Foreign > 0 {
		foreign = p.startForeign(ctx, m)
	}
	p.logf("relay, %d workers and the load generator started; plan %s from %s", o.Workers, plan.Name, m.Route)

	var wg sync.WaitGroup
	var scriptErr error
	script := slices.Clone(migrationScript)
	if o.MigrateTo == BrokerRabbitMQ {
		// DUAL_WRITE towards RabbitMQ checks the groups' queues on the
		// node and the topics they consume on the old cluster: premature
		// while either is down, asked again.
		script[1].gated = true
	}
	wg.Go(func() { scriptErr = p.runScript(ctx, ctl, m, script) })
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
	if foreign != nil {
		if err := foreign.stop(); err != nil {
			return nil, err
		}
	}
	if err := p.finish(ctx, r); err != nil {
		return nil, err
	}
	if p.bridge != nil {
		if !p.bridge.Alive() {
			r.Crashes = append(r.Crashes, fmt.Sprintf("bridge exited by itself: %v (log %s)", p.bridge.Err(), p.bridge.LogFile()))
		} else if err := p.bridge.Stop(30 * time.Second); err != nil {
			return nil, err
		}
	}
	if err := p.checkMigration(ctx, ctl, m); err != nil {
		return nil, err
	}
	rep = r
	return rep, nil
}

// openNewChannel creates the run's topics on the new channel (cluster B,
// or the stack's RabbitMQ node with every consumer's queues) and returns
// the plan that moves the run there from its own channel (another topic
// template; on cluster B more partitions), not yet created.
func (p *pipeline) openNewChannel(ctx context.Context, stack *Stack) (migration.Plan, error) {
	p.newTopic = "faultsb." + p.name + "." + AggregateType
	p.newDL = p.newTopic + ".dlq"
	plan := migration.Plan{Name: "move-" + p.name,
		Old:    migration.Channel{Brokers: stack.Brokers, TopicTemplate: "faults." + p.name + ".{aggregate_type}"},
		New:    migration.Channel{Brokers: stack.BrokersB, TopicTemplate: "faultsb." + p.name + ".{aggregate_type}"},
		Groups: p.consumers}
	if p.o.rabbit() {
		plan.Old = p.rabbitChannel(plan.Old.TopicTemplate)
	}
	if p.o.MigrateTo == BrokerRabbitMQ {
		plan.New = p.rabbitChannel(plan.New.TopicTemplate)
		if err := p.declareRabbitMQTopic(ctx, p.newTopic, p.consumers); err != nil {
			return migration.Plan{}, err
		}
		return plan, nil
	}
	if len(stack.BrokersB) == 0 {
		return migration.Plan{}, errors.New("a migration run needs the stack's cluster B (scripts/stack starts it unless FERRY_STACK_KAFKA_B=0)")
	}
	var err error
	if p.kclB, err = kgo.NewClient(kgo.SeedBrokers(stack.BrokersB...)); err != nil {
		return migration.Plan{}, err
	}
	p.admB = kadm.NewClient(p.kclB)
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
	return plan, nil
}

// migrationRoute names the channels of a migration run.
func migrationRoute(o Options) string {
	from, to := "cluster A", "cluster B"
	if o.Broker == BrokerRabbitMQ {
		from = "RabbitMQ"
	}
	if o.MigrateTo == BrokerRabbitMQ {
		to = "RabbitMQ"
	}
	return from + " to " + to
}

// oldQuietArgs shorten, on a RabbitMQ old channel, the quiet its drain
// waits for (the workers' --retry-backoff-max plus --handler-timeout: 90 s
// by default) to 12 s, so that OLD_RETIRED follows the last work there
// within the run.
func oldQuietArgs(o Options) []string {
	if !o.rabbit() {
		return nil
	}
	return []string{"--retry-backoff-max", "2s", "--handler-timeout", "10s"}
}

// rabbitChannel is the stack's RabbitMQ node as a plan's channel.
func (p *pipeline) rabbitChannel(template string) migration.Channel {
	return migration.Channel{Kind: migration.RabbitMQ, URL: p.stack.RabbitMQURL, PasswordEnv: rabbitPasswordEnv,
		TopicTemplate: template, Shards: p.o.shards()}
}

// getenv is the controller's environment: the plan's RabbitMQ password
// variable holds the stack's password.
func (p *pipeline) getenv(name string) string {
	if name == rabbitPasswordEnv {
		return p.stack.RabbitMQPassword
	}
	return os.Getenv(name)
}

// runScript asks script's requests, spread over the load.
func (p *pipeline) runScript(ctx context.Context, ctl *migration.Controller, m *MigrationFigures, script []scriptStep) error {
	gap := cmp.Or(p.o.StepGap, p.o.LoadDuration/time.Duration(len(script)+2))
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
	if p.o.MigrateTo == BrokerRabbitMQ {
		// A queue cannot be read again: what the workers recorded as
		// copies from the new channel stands for what reached it.
		err = p.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM ferry_inbox_copy WHERE side = 'new'`).
			Scan(&m.NewRecords, &m.NewDistinct)
	} else {
		m.NewRecords, m.NewDistinct, err = p.scanTopicOn(ctx, p.admB, p.kclB.Opts(), p.newTopic)
	}
	if err != nil || p.o.Foreign == 0 {
		return err
	}
	return p.pool.QueryRow(ctx, `SELECT count(DISTINCT c.message_id) FROM ferry_inbox_copy c
		JOIN fault_foreign f ON f.id::text = c.message_id WHERE c.side = 'new'`).Scan(&m.ForeignCopies)
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
	if m.ForeignPublished > 0 && m.ForeignCopies == 0 {
		v = append(v, "no bridged copy of the foreign producer's messages reached the workers")
	}
	return v
}
