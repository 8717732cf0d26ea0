//go:build faults

package inbox

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/outbox"
)

// Cluster B, the new channel, stops twice while the plan is in
// DUAL_WRITE and events flow. Afterwards every event the old channel holds
// a stamped copy of has a shadow copy on B (counted per event id, from B's
// topic itself: what the relay confirmed is there), and once the group
// caught up on both channels no report counts a shadow copy missing, as
// the report window passes over the copies of the run.
//
// It tells which side a report of missing shadows after new-cluster
// outages comes from (issue 21 item 6): the relay confirming copies B
// never took fails the first check, a report that miscounts the second.
// Before the load stops, the old channel falls behind the new one once
// (its handler held while 3,000 events go by, and the worker fetches no
// further than a small buffer), as a group's does when it lags or after a
// worker was killed: those events' shadows come first.
func TestFaultNewClusterOutagesLeaveNoShadowMissing(t *testing.T) {
	m := setupLiveMigrationFor(t, 9*time.Minute)
	// At most some 300 events a second: unpaced, the load wrote 55,000
	// events while Kafka B restarted twice, and the test spent minutes
	// catching up on them.
	m.writeEvery = 3 * time.Millisecond
	cfg := m.config()
	cfg.MigrationReportInterval = 200 * time.Millisecond
	cfg.MigrationAllowedLateness = time.Second
	cfg.MigrationReportWindow = 90 * time.Second
	// The reports' clock: once the group caught up, the test moves it on
	// instead of waiting for the window to pass in real time (a report is
	// a function of the copies and the time it is made at, and no copy
	// comes any more then).
	var ahead atomic.Int64
	cfg.hooks.reportClock = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	// Small enough that a held partition stops fetching, large enough that
	// the old channel keeps up with the load otherwise (64 KiB made it
	// fall minutes behind on a busy machine, the test near its deadline).
	cfg.MaxBufferedBytesPerPartition = 256 << 10
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var holdOld atomic.Bool
	releaseOld := make(chan struct{})
	w.Handle(m.consumer, m.oldTopic, func(ctx context.Context, tx pgx.Tx, msg *Message) error {
		if msg.Topic == m.oldTopic && holdOld.Load() {
			select {
			case <-releaseOld:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return insertEffect(ctx, tx, msg, msg.Topic)
	})
	m.start(w)

	m.request(migration.DualWrite, 0)
	stop := make(chan struct{})
	errs := m.writeUntil(stop)
	m.afterMore(200)
	for i := range 2 {
		ferrytest.Stack(t, "kafka-b-stop")
		m.afterMore(300) // written while B is down
		ferrytest.Stack(t, "kafka-b-start")
		// The relay confirms only what both channels acknowledged: once it
		// confirmed past what was written while B was down, B took it.
		m.waitConfirmed(fmt.Sprintf("the relay to confirm past B's outage %d", i+1), m.walNow())
		m.afterMore(200)
	}
	holdOld.Store(true)
	target := m.written.Load() + 3000
	m.afterMore(3000)
	m.waitFor("the shadows of the events written while the old channel is held", func() (bool, error) {
		return m.count(`SELECT count(*) FROM ferry_inbox_copy WHERE role = 'shadow'`) >= int(target), nil
	})
	close(releaseOld)
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	m.waitConfirmed("the relay to confirm every event", m.walNow())

	onA := stampedCopies(t, m.ctx, ferrytest.Client(t), m.oldTopic)
	onB := stampedCopies(t, m.ctx, ferrytest.ClientB(t), m.newTopic)
	var noShadow []string
	for id, c := range onA {
		if c.role == route.Authoritative && onB[id].n == 0 {
			noShadow = append(noShadow, id)
		}
	}
	slices.Sort(noShadow)
	t.Logf("%d events written, %d stamped on A, %d on B; %d without a copy on B", m.written.Load(), len(onA), len(onB), len(noShadow))
	if len(noShadow) > 0 {
		t.Errorf("the relay confirmed %d events whose shadow copy cluster B does not hold (the first: %v)", len(noShadow), noShadow[:min(5, len(noShadow))])
	}

	m.waitCaughtUp(ferrytest.Admin(t), m.oldTopic)
	m.waitCaughtUp(ferrytest.AdminB(t), m.newTopic)
	caughtUp := time.Now()
	var last time.Time
	if err := m.db.Pool.QueryRow(m.ctx, `SELECT max(received_at) FROM ferry_inbox_copy WHERE consumer = $1`, m.consumer).Scan(&last); err != nil {
		t.Fatal(err)
	}
	t.Logf("shadows before their authoritative copy: %d, by up to %s", m.count(`SELECT count(*) FROM ferry_inbox_copy s
		JOIN ferry_inbox_copy a ON a.consumer = s.consumer AND a.message_id = s.message_id AND a.role = 'authoritative'
		WHERE s.role = 'shadow' AND s.received_at < a.received_at`), m.str(`SELECT coalesce(max(a.received_at - s.received_at), '0')::text
		FROM ferry_inbox_copy s JOIN ferry_inbox_copy a ON a.consumer = s.consumer AND a.message_id = s.message_id AND a.role = 'authoritative'
		WHERE s.role = 'shadow'`))

	// Every report from now on, until the window passed the last copy,
	// speaks of copies all of which have both copies. The clock goes some
	// 10 times faster than real time: reports come every 200 ms, so the
	// window's start moves in steps of a few seconds, finer than the lead
	// of the shadows over the copies of the held old channel.
	ev := &migration.ReportEvidence{MaxP99Lateness: time.Hour, MaxAge: time.Minute}
	plan := migration.Plan{Name: "move", Old: migration.Channel{Brokers: ferrytest.Brokers(t), TopicTemplate: "unused"}}
	var r, worst migration.Report
	reports := 0
	m.waitFor("the report window to pass the last copy", func() (bool, error) {
		ahead.Add(int64(500 * time.Millisecond))
		got, err := ev.Reports(m.ctx, plan)
		if err != nil {
			return false, nil
		}
		r = got[m.consumer]
		if r.At.After(caughtUp) {
			reports++
			if r.Missing > worst.Missing {
				worst = r
			}
		}
		return r.At.After(last.Add(cfg.MigrationReportWindow)), nil
	})
	t.Logf("%d reports read; the last: %d authoritative, %d shadow, %d checked", reports, r.Authoritative, r.Shadow, r.Checked)
	if worst.Missing != int64(len(noShadow)) {
		t.Errorf("a report at %s, the group caught up, counts %d shadow copies missing (of %d authoritative copies, %d checked); cluster B lacks %d",
			worst.At.Format(time.TimeOnly), worst.Missing, worst.Authoritative, worst.Checked, len(noShadow))
	}
}

func (m *liveMigration) str(q string) string {
	m.t.Helper()
	var s string
	if err := m.db.Pool.QueryRow(m.ctx, q).Scan(&s); err != nil {
		m.t.Fatal(err)
	}
	return s
}

// walNow is the server's WAL insert position.
func (m *liveMigration) walNow() string {
	m.t.Helper()
	var lsn string
	if err := m.db.Pool.QueryRow(m.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		m.t.Fatal(err)
	}
	return lsn
}

// waitConfirmed waits until the relay's slot confirmed lsn.
func (m *liveMigration) waitConfirmed(what, lsn string) {
	m.t.Helper()
	m.waitFor(what, func() (bool, error) {
		var done bool
		err := m.db.Pool.QueryRow(m.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`,
			m.slot, lsn).Scan(&done)
		return done, err
	})
}

// waitCaughtUp waits until the group committed every record of topic.
func (m *liveMigration) waitCaughtUp(adm *kadm.Client, topic string) {
	m.t.Helper()
	m.waitFor(fmt.Sprintf("%s to commit all of %s", m.consumer, topic), func() (bool, error) {
		lags, err := adm.Lag(m.ctx, m.consumer)
		if err != nil {
			return false, nil
		}
		l, ok := lags[m.consumer]
		if !ok || l.Error() != nil {
			return false, nil
		}
		tl, ok := l.Lag.TotalByTopic()[topic]
		return ok && tl.Lag == 0, nil
	})
}

// stampedCopy counts one event's stamped copies on a topic.
type stampedCopy struct {
	n    int
	role route.Role
}

// stampedCopies reads topic from its start to its end and counts, per
// event id, the copies with a route stamp.
func stampedCopies(t *testing.T, ctx context.Context, cl *kgo.Client, topic string) map[string]stampedCopy {
	t.Helper()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	parts := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
			parts[o.Partition] = kgo.NewOffset().AtStart()
		}
	})
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts})
	out := map[string]stampedCopy{}
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s: %v (%d partitions not read to their end)", topic, err, len(want))
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
			var id, stamp string
			for _, h := range r.Headers {
				switch h.Key {
				case outbox.HeaderID:
					id = string(h.Value)
				case route.HeaderRoute:
					stamp = string(h.Value)
				}
			}
			st, err := route.ParseStamp(stamp)
			if stamp == "" || err != nil {
				return
			}
			c := out[id]
			c.n++
			c.role = st.Role
			out[id] = c
		})
	}
	return out
}
