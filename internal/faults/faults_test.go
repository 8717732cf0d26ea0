//go:build faults

package faults_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/faults"
	"github.com/ferryhq/ferry/internal/ferrytest"
)

// These tests stop the broker and restart PostgreSQL of the stack in
// FERRY_STACK_DIR: they run alone, after the parallel suite (scripts/test).
// When FERRY_FAULTS_REPORT names a file, the reports are appended to it.

var (
	buildOnce sync.Once
	binDir    string
	bins      faults.Binaries
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// setup builds the binaries once and gives the test options with a work
// directory that is kept, and named, when the test fails.
func setup(t *testing.T) faults.Options {
	t.Helper()
	ferrytest.AdminURL(t) // fails (or skips with -short) without a stack
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "ferry-faults-bin")
		if buildErr == nil {
			bins, buildErr = faults.BuildBinaries(t.Context(), binDir)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	work, err := os.MkdirTemp("", "ferry-faults-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs kept in %s", work)
			return
		}
		_ = os.RemoveAll(work)
	})
	o := faults.Short()
	o.Bins, o.WorkDir, o.Log = bins, work, logWriter{t}
	return o
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func publish(t *testing.T, md string) {
	t.Helper()
	t.Log("\n" + md)
	path := os.Getenv("FERRY_FAULTS_REPORT")
	if path == "" {
		return
	}
	f, err := os.OpenFile(filepath.Clean(path), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(md + "\n"); err != nil {
		t.Fatal(err)
	}
}

// The short suite: every fault kind at least once under 24,000 events, and
// every invariant holds.
func TestFaultSuite(t *testing.T) {
	o := setup(t)
	ctx := ferrytest.Context(t, 10*time.Minute)
	rep, err := faults.Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, rep.Markdown())
	for _, v := range rep.Violations() {
		t.Error(v)
	}
	// A run that did not exercise what it checks proves less than it says.
	counts := rep.FaultCounts()
	for _, k := range faults.AllFaults {
		if counts[k] == 0 {
			t.Errorf("fault %s was never injected", k)
		}
	}
	if rep.Committed.Events < 20_000 {
		t.Errorf("%d events committed, want at least 20,000", rep.Committed.Events)
	}
	if rep.Committed.Poison == 0 || rep.Committed.Huge == 0 {
		t.Errorf("%d poison and %d oversized events: the dead-letter and quarantine paths went untested", rep.Committed.Poison, rep.Committed.Huge)
	}
	if rep.Aborted.Events == 0 {
		t.Error("no write transaction failed: the rollback check went untested")
	}
}

// The negative control: a relay that confirms on send, killed while the
// broker is down, loses events, and the checker must say so.
func TestFaultNegativeControl(t *testing.T) {
	o := setup(t)
	ctx := ferrytest.Context(t, 5*time.Minute)
	rep, err := faults.RunControl(ctx, faults.ControlOptions(o))
	if err != nil {
		t.Fatal(err)
	}
	caught(t, rep)
}

// The other negative control: a worker that commits offsets before its
// database transaction, killed with batches in flight, loses effects, and
// the checker must say so.
func TestFaultNegativeControlWorker(t *testing.T) {
	o := setup(t)
	ctx := ferrytest.Context(t, 5*time.Minute)
	rep, err := faults.RunWorkerControl(ctx, faults.WorkerControlOptions(o))
	if err != nil {
		t.Fatal(err)
	}
	caught(t, rep)
}

// caught passes only a control whose run drained and whose loss the checker
// reported (Report.ControlCaught).
func caught(t *testing.T, rep *faults.Report) {
	t.Helper()
	publish(t, rep.Markdown())
	if err := rep.ControlCaught(); err != nil {
		t.Fatalf("negative control not caught: %v (drained %t, %d lost, violations %q)", err, rep.Drained, rep.Lost(), rep.Violations())
	}
	t.Logf("the checker caught the negative control: %d lost effects over %d consumers", rep.Lost(), len(rep.Consumers))
}

// The migration run: while the load runs and the relay, a worker and
// either broker fail, the plan moves from cluster A to cluster B through
// every phase, slice steps, a rollback drill and the retirement, with
// forbidden requests among them; M1 to M4 and per-aggregate order hold.
func TestFaultMigration(t *testing.T) {
	o := setup(t)
	o.Kinds = faults.MigrationFaults
	// Half the suite's load: during a migration every event is consumed
	// twice, once per channel, on this machine's two cores.
	o.Events /= 2
	migrationRun(t, o)
}

// The same from RabbitMQ to cluster B, with a producer that is not
// Ferry's publishing to the old exchange throughout, bridged by `relay
// bridge`: its events are held to the same invariants, RabbitMQ and
// cluster B are stopped, the relay and a worker killed.
func TestFaultMigrationFromRabbitMQ(t *testing.T) {
	o := rabbitMigration(setup(t))
	o.Foreign = 10
	migrationRun(t, o)
}

// The same from cluster A to RabbitMQ: the groups' queues are declared
// on the node before DUAL_WRITE; cluster A and RabbitMQ are stopped.
func TestFaultMigrationToRabbitMQ(t *testing.T) {
	o := setup(t)
	o.MigrateTo = faults.BrokerRabbitMQ
	o.Events = 6_000
	// No oversized events: cluster A refuses them and RabbitMQ (16 MiB)
	// takes them, so each one's shadow would wait in the migration
	// quarantine, holding OLD_RETIRED until a replay (the lossy runs
	// test that path).
	o.HugeEvery = 0
	o.KafkaOutage = faults.RabbitMQShort().KafkaOutage
	o.Kinds = faults.MigrationFaultsOf(o)
	migrationRun(t, o)
}

// rabbitMigration is o from the stack's RabbitMQ node: RabbitMQShort's
// outages, a quarter of the suite's load (a RabbitMQ worker applies some
// 500 events a second on two cores, and every event is consumed twice).
func rabbitMigration(o faults.Options) faults.Options {
	r := faults.RabbitMQShort()
	o.Broker = faults.BrokerRabbitMQ
	o.Events = 6_000
	o.PoisonEvery, o.HugeEvery = r.PoisonEvery, r.HugeEvery
	o.KafkaOutage, o.FaultGap = r.KafkaOutage, r.FaultGap
	o.Kinds = faults.MigrationFaultsOf(o)
	return o
}

// migrationRun runs RunMigration with o and holds it to every invariant.
// The script's requests come 2 s apart (the gates wait as long as they
// must), so that the run lasts about as long as its load.
func migrationRun(t *testing.T, o faults.Options) {
	t.Helper()
	o.StepGap = 2 * time.Second
	ctx := ferrytest.Context(t, 10*time.Minute)
	rep, err := faults.RunMigration(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, rep.Markdown())
	for _, v := range rep.Violations() {
		t.Error(v)
	}
	counts := rep.FaultCounts()
	for _, k := range o.Kinds {
		if counts[k] == 0 {
			t.Errorf("fault %s was never injected", k)
		}
	}
	forbidden := 0
	for _, a := range rep.Migration.Asked {
		if a.Forbidden {
			forbidden++
		}
	}
	if forbidden == 0 {
		t.Error("no forbidden request was asked: M4's rejections went untested")
	}
}

// Seed 002's negative control: the new channel (cluster A) silently drops
// 1% of its authoritative copies and the old one (RabbitMQ: the control
// across kinds) is retired at cutover with no drain and no quarantine. The
// dropped events are lost, and the checker must report exactly them:
// every dropped event lost for every consumer, nothing else. (Between two
// Kafka clusters the control is the same code and checker.)
func TestFaultMigrationLossyFromRabbitMQNegativeControl(t *testing.T) {
	lossyControl(t, rabbitLossy(t))
}

// rabbitLossy are the lossy runs' options with the old channel on the
// stack's RabbitMQ node and half their events (each is consumed twice, at
// some 500 deliveries a second per worker).
func rabbitLossy(t *testing.T) faults.Options {
	o := faults.LossyOptions(rabbitOptions(t))
	o.Events = 3_000
	return o
}

// lossyControl runs the lossy negative control with o and wants exactly the
// dropped events reported lost.
func lossyControl(t *testing.T, o faults.Options) {
	t.Helper()
	ctx := ferrytest.Context(t, 5*time.Minute)
	rep, err := faults.RunLossyMigration(ctx, o, false)
	if err != nil {
		t.Fatal(err)
	}
	caught(t, rep)
	for _, c := range rep.Lossy.Consumers {
		if c.LostDropped != rep.Lossy.Dropped || c.LostOther != 0 {
			t.Errorf("%s: the checker reports %d of the %d dropped events lost, and %d others: it should report exactly the dropped ones",
				c.Consumer, c.LostDropped, rep.Lossy.Dropped, c.LostOther)
		}
	}
}

// The same lossy channel (here from RabbitMQ to cluster A) with the drain
// and the quarantine: every dropped event reaches every consumer's
// quarantine, OLD_RETIRED is refused while they wait there, and after the
// replay (to the shard queue the shadow came from) nothing is lost or
// applied twice. With the next test, each way of finding a lost copy (the
// group's position on Kafka, the fences of a later step on RabbitMQ) and
// each replay (to RabbitMQ, to Kafka) is covered; between two Kafka
// clusters the code is the same.
func TestFaultMigrationLossyFromRabbitMQQuarantined(t *testing.T) {
	lossyQuarantined(t, rabbitLossy(t))
}

// The same from cluster A to RabbitMQ, where a worker cannot read its
// group's position: OLD_RETIRED is refused while the dropped copies wait
// (those of the last step's epoch unwatched); a step back to DUAL_WRITE
// and on to CUTOVER 128 writes the fences that show them lost, and they
// are quarantined and replayed to cluster A.
func TestFaultMigrationLossyToRabbitMQQuarantined(t *testing.T) {
	o := faults.LossyOptions(setup(t))
	o.MigrateTo, o.Events = faults.BrokerRabbitMQ, 3_000
	lossyQuarantined(t, o)
}

// lossyQuarantined runs the safe lossy run with o and holds it to every
// invariant.
func lossyQuarantined(t *testing.T, o faults.Options) {
	t.Helper()
	ctx := ferrytest.Context(t, 6*time.Minute)
	rep, err := faults.RunLossyMigration(ctx, o, true)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, rep.Markdown())
	for _, v := range rep.Violations() {
		t.Error(v)
	}
}

// The short suite on RabbitMQ: RabbitMQFaults once each (the broker
// stopped, killed and frozen among them) under the load, and every
// invariant holds. A queue cannot be read again: the duplicates RabbitMQ
// delivered are the workers' counters.
func TestFaultSuiteRabbitMQ(t *testing.T) {
	o := setup(t)
	r := faults.RabbitMQShort()
	r.Bins, r.WorkDir, r.Log = o.Bins, o.WorkDir, o.Log
	ctx := ferrytest.Context(t, 8*time.Minute)
	start := time.Now()
	rep, err := faults.Run(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, rep.Markdown())
	t.Logf("RabbitMQ run took %s", time.Since(start).Round(time.Second))
	for _, v := range rep.Violations() {
		t.Error(v)
	}
	counts := rep.FaultCounts()
	for _, k := range faults.RabbitMQFaults {
		if counts[k] == 0 {
			t.Errorf("fault %s was never injected", k)
		}
	}
	if rep.Committed.Events < int64(r.Events*4/5) {
		t.Errorf("%d events committed, want at least %d", rep.Committed.Events, r.Events*4/5)
	}
	if rep.Committed.Poison == 0 || rep.Committed.Huge == 0 {
		t.Errorf("%d poison and %d oversized events: the dead-letter and quarantine paths went untested", rep.Committed.Poison, rep.Committed.Huge)
	}
	for _, c := range rep.Consumers {
		if c.DeadLettered == 0 || c.Quarantined == 0 {
			t.Errorf("%s: %d dead-lettered, %d quarantined: the .dlq stream or the relay's quarantine went unread", c.Consumer, c.DeadLettered, c.Quarantined)
		}
	}
	if rep.Aborted.Events == 0 {
		t.Error("no write transaction failed: the rollback check went untested")
	}
}

// rabbitOptions are setup's options on RabbitMQ.
func rabbitOptions(t *testing.T) faults.Options {
	o := setup(t)
	r := faults.RabbitMQShort()
	r.Bins, r.WorkDir, r.Log = o.Bins, o.WorkDir, o.Log
	return r
}

// A relay that counts a RabbitMQ publish as acknowledged once written,
// under a broker frozen and then SIGKILLed, loses what the broker never
// enqueued, and the checker must say so.
func TestFaultRabbitMQNegativeControlConfirmOnSend(t *testing.T) {
	o := rabbitOptions(t)
	ctx := ferrytest.Context(t, 4*time.Minute)
	rep, err := faults.RunControl(ctx, faults.RabbitMQControlOptions(o))
	if err != nil {
		t.Fatal(err)
	}
	caught(t, rep)
}

// A worker that acknowledges deliveries before its transaction, SIGKILLed
// with batches in flight, loses their effects, and the checker must say
// so.
func TestFaultRabbitMQNegativeControlAckBeforeCommit(t *testing.T) {
	o := rabbitOptions(t)
	ctx := ferrytest.Context(t, 4*time.Minute)
	rep, err := faults.RunWorkerControl(ctx, faults.RabbitMQWorkerControlOptions(o))
	if err != nil {
		t.Fatal(err)
	}
	caught(t, rep)
}

// A relay publishing without mandatory while one shard's queues are
// unbound has the broker drop those events, unreturned: lost, not
// quarantined, and the checker must say so.
func TestFaultRabbitMQNegativeControlNoMandatory(t *testing.T) {
	o := rabbitOptions(t)
	ctx := ferrytest.Context(t, 4*time.Minute)
	rep, err := faults.RunNoMandatoryControl(ctx, faults.RabbitMQControlOptions(o))
	if err != nil {
		t.Fatal(err)
	}
	caught(t, rep)
	if n := rep.QuarantineReasons["unroutable"]; n > 0 {
		t.Errorf("%d events quarantined as unroutable: a relay without mandatory should never hear of them", n)
	}
}

// A worker retrying by requeue sends a failed delivery behind its
// aggregate's later versions: the checker must report order inversions.
func TestFaultRabbitMQNegativeControlRequeueRetries(t *testing.T) {
	o := rabbitOptions(t)
	ctx := ferrytest.Context(t, 4*time.Minute)
	rep, err := faults.RunRequeueControl(ctx, faults.RequeueControlOptions(o))
	if err != nil {
		t.Fatal(err)
	}
	publish(t, rep.Markdown())
	if err := rep.OrderControlCaught(); err != nil {
		t.Fatalf("negative control not caught: %v (drained %t, violations %q)", err, rep.Drained, rep.Violations())
	}
	t.Logf("the checker caught the negative control: %d order inversions over %d consumers", rep.Inversions(), len(rep.Consumers))
}
