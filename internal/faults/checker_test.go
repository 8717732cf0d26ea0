package faults

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/outbox"
)

// checkerFixture is a run's database and topics with no processes: the test
// writes the history it wants the checker to judge.
type checkerFixture struct {
	t   *testing.T
	ctx context.Context
	p   *pipeline
}

func newCheckerFixture(t *testing.T) *checkerFixture {
	t.Helper()
	ctx := ferrytest.Context(t, 2*time.Minute)
	o := Short()
	o.Aggregates, o.Consumers, o.Partitions = 3, 2, 2
	o.WorkDir, o.Log = t.TempDir(), &testLog{t}
	stack := &Stack{DatabaseURL: ferrytest.AdminURL(t), Brokers: ferrytest.Brokers(t)}
	p, err := newPipeline(ctx, &o, stack, "check")
	if p != nil {
		t.Cleanup(func() { p.close(false) })
	}
	if err != nil {
		t.Fatal(err)
	}
	return &checkerFixture{t: t, ctx: ctx, p: p}
}

type testLog struct{ t *testing.T }

func (l *testLog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// write commits events the way the load generator does: versions bumped in
// the same transaction. It returns the ids in order.
func (f *checkerFixture) write(kind, agg string) uuid.UUID {
	f.t.Helper()
	var id uuid.UUID
	err := pgx.BeginFunc(f.ctx, f.p.pool, func(tx pgx.Tx) error {
		e := outbox.Event{ID: uuid.Must(uuid.NewV7()), AggregateType: AggregateType, AggregateID: agg, EventType: "Changed"}
		switch kind {
		case KindVersioned:
			var v int64
			if err := tx.QueryRow(f.ctx, `UPDATE fault_versions SET version = version + 1 WHERE aggregate_id = $1 RETURNING version`, agg).Scan(&v); err != nil {
				return err
			}
			e.Payload = encodeBody(eventBody{Kind: kind, Aggregate: agg, Version: v}, nil)
			e.Headers = map[string]string{HeaderVersion: strconv.FormatInt(v, 10)}
		case KindPoison:
			e.EventType, e.Payload = "Poison", encodeBody(eventBody{Kind: kind, Aggregate: agg}, nil)
		case KindHuge:
			e.EventType, e.Payload = "Huge", encodeBody(eventBody{Kind: kind, Aggregate: agg}, make([]byte, 10))
		}
		id = e.ID
		_, err := outbox.Write(f.ctx, tx, e)
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

// apply runs the real handler on a message, in its own transaction.
func (f *checkerFixture) apply(consumer string, id uuid.UUID) {
	f.t.Helper()
	var payload []byte
	if err := f.p.pool.QueryRow(f.ctx, `SELECT payload FROM outbox WHERE id = $1`, id).Scan(&payload); err != nil {
		// An id the outbox does not hold: an unversioned effect.
		payload = encodeBody(eventBody{Kind: KindHuge, Aggregate: "ghost"}, nil)
	}
	e := &Effects{Worker: "test"}
	err := pgx.BeginFunc(f.ctx, f.p.pool, func(tx pgx.Tx) error {
		return e.Handle(f.ctx, tx, &inbox.Message{ID: id.String(), Consumer: consumer, Payload: payload})
	})
	if err != nil {
		f.t.Fatalf("apply %s for %s: %v", id, consumer, err)
	}
}

func (f *checkerFixture) deadLetter(consumer string, id uuid.UUID) {
	f.t.Helper()
	cl := ferrytest.Client(f.t)
	hs := []kgo.RecordHeader{
		{Key: outbox.HeaderID, Value: []byte(id.String())},
		{Key: inbox.HeaderDeadLetterReason, Value: []byte(inbox.ReasonPermanent)},
		{Key: inbox.HeaderDeadLetterConsumer, Value: []byte(consumer)},
		{Key: inbox.HeaderDeadLetterOriginalTopic, Value: []byte(f.p.topic)},
		{Key: inbox.HeaderDeadLetterOriginalPartition, Value: []byte("0")},
		{Key: inbox.HeaderDeadLetterOriginalOffset, Value: []byte("0")},
	}
	if err := cl.ProduceSync(f.ctx, &kgo.Record{Topic: f.p.dlq, Value: []byte("x"), Headers: hs}).FirstErr(); err != nil {
		f.t.Fatal(err)
	}
}

func (f *checkerFixture) quarantine(id uuid.UUID) {
	f.t.Helper()
	if _, err := f.p.pool.Exec(f.ctx, `INSERT INTO outbox_quarantine
		(id, aggregate_type, aggregate_id, event_type, payload, created_at, topic, reason, error)
		SELECT id, aggregate_type, aggregate_id, event_type, payload, created_at, $2, 'message_too_large', 'too big'
		FROM outbox WHERE id = $1`, id, f.p.topic); err != nil {
		f.t.Fatal(err)
	}
}

func (f *checkerFixture) abort(id uuid.UUID, outcome string) {
	f.t.Helper()
	b, _ := json.Marshal(abortedLine{ID: id, Outcome: outcome})
	fh, err := os.OpenFile(f.p.abortedFile(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		f.t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.Write(append(b, '\n')); err != nil {
		f.t.Fatal(err)
	}
}

// The checker must see each kind of violation, in a consumer that commits
// them, and none in a consumer that applied the same history correctly. A
// checker that cannot fail proves nothing.
func TestCheckerSeesEveryViolation(t *testing.T) {
	t.Parallel()
	f := newCheckerFixture(t)
	good, bad := f.p.consumers[0], f.p.consumers[1]
	a0, a1 := aggregateName(0), aggregateName(1)
	a0v1, a0v2, a0v3 := f.write(KindVersioned, a0), f.write(KindVersioned, a0), f.write(KindVersioned, a0)
	a1v1, a1v2 := f.write(KindVersioned, a1), f.write(KindVersioned, a1)
	poison, huge := f.write(KindPoison, "poison-1"), f.write(KindHuge, "huge-1")
	f.quarantine(huge)
	rolledBack := uuid.Must(uuid.NewV7())
	f.abort(rolledBack, OutcomeRolledBack)

	// The good consumer: everything once, in order; the poison event
	// dead-lettered, the huge one quarantined.
	for _, id := range []uuid.UUID{a0v1, a0v2, a0v3, a1v1, a1v2} {
		f.apply(good, id)
	}
	f.deadLetter(good, poison)

	// The bad one: a0 v1 twice, v3 before v2; a1 v2 never; the poison event
	// neither applied nor dead-lettered; an effect for a rolled-back event.
	for _, id := range []uuid.UUID{a0v1, a0v1, a0v3, a0v2, a1v1, rolledBack} {
		f.apply(bad, id)
	}

	rep := &Report{Drained: true}
	if err := f.p.check(f.ctx, rep); err != nil {
		t.Fatal(err)
	}
	byName := map[string]ConsumerFigures{}
	for _, c := range rep.Consumers {
		byName[c.Consumer] = c
	}
	g, b := byName[good], byName[bad]
	if g.Lost+g.DoubleEffects+g.Inversions+g.Gaps+g.StateMismatches+g.UnknownEffects != 0 || g.DeadLettered != 1 || g.Quarantined != 1 {
		t.Errorf("correct consumer judged wrong: %+v", g)
	}
	want := ConsumerFigures{Consumer: bad, Effects: 6, Applied: 5, Lost: 2, DoubleEffects: 1, Inversions: 2, Gaps: 1,
		StateMismatches: 2, UnknownEffects: 1, Quarantined: 1}
	if len(b.Missing) != 2 || len(b.lost) != 2 {
		t.Errorf("missing ids %v (all: %v), want the 2 lost", b.Missing, b.lost)
	}
	b.Missing, b.lost = nil, nil
	if !reflect.DeepEqual(b, want) {
		t.Errorf("broken consumer:\n got %+v\nwant %+v", b, want)
	}
	if rep.Aborted.Events != 1 || rep.Aborted.WithEffect != 1 || rep.Aborted.Committed != 0 {
		t.Errorf("aborted figures %+v, want 1 event, with an effect, not committed", rep.Aborted)
	}
	if rep.Committed.Events != 7 || rep.Committed.Versioned != 5 || rep.Committed.LatestVersions != 5 {
		t.Errorf("committed figures %+v", rep.Committed)
	}
	if rep.OK() || len(rep.Violations()) != 7 {
		t.Errorf("violations %q, want 7 (lost, double, inversions, gaps, state, unknown, aborted effect)", rep.Violations())
	}
	md := rep.Markdown()
	for _, s := range []string{"FAIL: 7 invariant violations", bad + ": 2 committed events lost", "quarantined by the relay | 1 (message_too_large ×1)"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q:\n%s", s, md)
		}
	}
}
