package inbox

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// commitGate parks the periodic commit loop at its tick, so that a revoke
// or a loss can happen between the tick and the commit it leads to.
type commitGate struct {
	armed atomic.Bool
	in    chan struct{} // the loop reached its tick and waits
	out   chan struct{} // let it go on
	done  chan struct{} // the test ended: never wait again
}

// newCommitGate installs the gate in cfg; defer its open, so that the loop
// runs freely before the worker stops.
func newCommitGate(cfg *Config) *commitGate {
	g := &commitGate{in: make(chan struct{}), out: make(chan struct{}), done: make(chan struct{})}
	cfg.hooks.periodicCommit = func() {
		if !g.armed.Load() {
			return
		}
		select {
		case g.in <- struct{}{}:
		case <-g.done:
			return
		}
		select {
		case <-g.out:
		case <-g.done:
		}
	}
	return g
}

// open lets the loop run freely from now on.
func (g *commitGate) open() {
	g.armed.Store(false)
	close(g.done)
}

// park waits until the loop waits at a tick.
func (g *commitGate) park(ctx context.Context, t *testing.T) {
	t.Helper()
	g.armed.Store(true)
	select {
	case <-g.in:
	case <-ctx.Done():
		t.Fatal("the commit loop never reached its tick")
	}
}

// cycle lets the parked loop commit and waits until it is back at its next
// tick: the commit it was parked before is done.
func (g *commitGate) cycle(ctx context.Context, t *testing.T) {
	t.Helper()
	select {
	case g.out <- struct{}{}:
	case <-ctx.Done():
		t.Fatal("the commit loop is not parked")
	}
	g.park(ctx, t)
}

// lockInbox holds a lock on the inbox table that every claim waits for, so
// that no member finishes (and commits) anything until the test ends.
func (b *bundle) lockInbox() {
	b.t.Helper()
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(b.ctx, `LOCK TABLE inbox IN SHARE MODE`); err != nil {
		b.t.Fatal(err)
	}
}

// A partition's work is never committed by a member that no longer owns
// it, even by a periodic commit that was about to start when the partition
// went. Lost: the group expels the member (a static member removed by the
// admin API, as a session timeout would); the member rejoins at once; the
// work it had finished but not committed must stay uncommitted, as onLost
// promises: another member may own the partition already. Revoked: the
// member commits what it finished while it still owns the partition, and a
// commit loop that ticked before the revoke does not commit it again over
// the new owner's later commit.
func TestPeriodicCommitNeverCommitsAPartitionGone(t *testing.T) {
	t.Parallel()
	t.Run("lost", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 1)
		instance := ferrytest.Name(t, "a")
		cfg := b.config()
		cfg.KafkaOpts = append(cfg.KafkaOpts, kgo.InstanceID(instance))
		cfg.DrainTimeout = time.Second
		gate := newCommitGate(cfg)
		defer gate.open()
		a := b.newWorker(cfg, effectHandler)
		b.start(a)
		for i := 1; i <= 3; i++ {
			b.produce(b.record(fmt.Sprintf("m-%d", i), "k", 0, i))
		}
		b.waitCommitted(b.consumer, 0, 3)

		// The loop ticks; the member then finishes three more messages.
		gate.park(b.ctx, t)
		for i := 4; i <= 6; i++ {
			b.produce(b.record(fmt.Sprintf("m-%d", i), "k", 0, i))
		}
		b.waitFor("m-4..m-6 applied", func() (bool, error) { return b.count(`SELECT count(*) FROM effects`) == 6, nil })

		// Nobody finishes anything from here on, so a commit at 6 can only
		// be the lost work's.
		b.lockInbox()
		lostMember := memberID(a)
		adm := ferrytest.Admin(t)
		res, err := adm.LeaveGroup(b.ctx, kadm.LeaveGroup(b.consumer).InstanceIDs(instance).Reason("test: the member is lost"))
		if err == nil {
			err = res.Error()
		}
		if err != nil {
			t.Fatalf("remove %s from the group: %v", instance, err)
		}
		// onLost returned before the member joins again.
		b.waitFor("the member to lose its partition and join again", func() (bool, error) {
			if a.Stats().PartitionsLost != 1 {
				return false, nil
			}
			m := memberID(a)
			if m == "" || m == lostMember {
				return false, nil
			}
			gs, err := adm.DescribeGroups(b.ctx, b.consumer)
			if err != nil {
				return false, err
			}
			g := gs[b.consumer]
			return g.State == "Stable" && len(g.Members) == 1 && g.Members[0].MemberID == m, nil
		})

		gate.cycle(b.ctx, t)
		if got := b.committed(b.consumer, 0); got != 3 {
			t.Errorf("committed offset %d after the partition was lost at 3: the lost work was committed", got)
		}
	})

	t.Run("revoked", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 2)
		cfg := b.config()
		gate := newCommitGate(cfg)
		defer gate.open()
		a := b.newWorker(cfg, effectHandler)
		b.start(a)
		b.produce(b.record("m-0-1", "k0", 0, 1), b.record("m-1-1", "k1", 1, 1))
		b.waitCommitted(b.consumer, 0, 1)
		b.waitCommitted(b.consumer, 1, 1)

		// The loop ticks; A then finishes one more message per partition.
		gate.park(b.ctx, t)
		b.produce(b.record("m-0-2", "k0", 0, 2), b.record("m-1-2", "k1", 1, 2))
		b.waitFor("m-0-2 and m-1-2 applied", func() (bool, error) { return b.count(`SELECT count(*) FROM effects`) == 4, nil })

		// B joins: A gives up one partition and commits it on the way out,
		// while its loop stays parked.
		bw := b.newWorker(b.config(), func(ctx context.Context, tx pgx.Tx, m *Message) error { return insertEffect(ctx, tx, m, "B") })
		b.start(bw)
		var moved, kept int32
		b.waitFor("A to commit the partition it gives up", func() (bool, error) {
			if a.Stats().PartitionsRevoked != 1 {
				return false, nil
			}
			c0, c1 := b.committed(b.consumer, 0), b.committed(b.consumer, 1)
			switch {
			case c0 == 2 && c1 == 1:
				moved, kept = 0, 1
			case c1 == 2 && c0 == 1:
				moved, kept = 1, 0
			default:
				return false, nil
			}
			return true, nil
		})
		// B, the new owner, applies and commits past it.
		b.produce(b.record(fmt.Sprintf("m-%d-3", moved), fmt.Sprintf("k%d", moved), moved, 3))
		b.waitCommitted(b.consumer, moved, 3)

		gate.cycle(b.ctx, t)
		if got := b.committed(b.consumer, moved); got != 3 {
			t.Errorf("partition %d: committed offset %d after B committed 3: A committed it after the revoke", moved, got)
		}
		if got := b.committed(b.consumer, kept); got != 2 {
			t.Errorf("partition %d, still A's: committed offset %d, want 2", kept, got)
		}
		if n := b.count(`SELECT count(*) FROM effects WHERE worker = 'B'`); n != 1 {
			t.Errorf("B applied %d messages, want 1", n)
		}
	})
}
