package bridge

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
)

// stepWatch follows a plan's current step: it reads it from PostgreSQL
// every interval. The bridge stamps each copy with the step it knew when
// it read the record from the old channel. A step the database cannot
// give is not guessed: the last one read stays current, and the failure
// is logged.
type stepWatch struct {
	ctl      *migration.Controller
	plan     string
	interval time.Duration
	log      *slog.Logger
	reads    atomic.Int64

	mu      sync.Mutex
	cur     route.Step
	changed chan struct{} // closed when cur changes, then replaced
}

func newStepWatch(ctl *migration.Controller, st *migration.State, interval time.Duration, log *slog.Logger) *stepWatch {
	w := &stepWatch{ctl: ctl, plan: st.Plan.Name, interval: interval, log: log, changed: make(chan struct{})}
	w.cur = stepOf(st)
	w.reads.Store(1)
	return w
}

func stepOf(st *migration.State) route.Step {
	return route.Step{Plan: st.Plan.Name, Epoch: st.Epoch, Phase: st.Phase, Slices: st.Slices}
}

// current returns the step and a channel closed when it changes.
func (w *stepWatch) current() (route.Step, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur, w.changed
}

// run reads the step every interval until ctx ends.
func (w *stepWatch) run(ctx context.Context) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := w.ctl.State(ctx, w.plan)
		if err != nil {
			if ctx.Err() == nil && !failing {
				w.log.Warn("cannot read the plan's step; copies keep the last step read until it can",
					slog.String("error", err.Error()))
			}
			failing = ctx.Err() == nil
			continue
		}
		if failing {
			w.log.Info("the plan's step can be read again")
			failing = false
		}
		w.reads.Add(1)
		w.set(stepOf(st))
	}
}

func (w *stepWatch) set(s route.Step) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s == w.cur {
		return
	}
	w.log.Info("the plan's step changed: copies from now on follow it",
		slog.Int("epoch", s.Epoch), slog.String("phase", string(s.Phase)), slog.Int("slices", s.Slices),
		slog.Int("previous_epoch", w.cur.Epoch), slog.String("previous_phase", string(w.cur.Phase)))
	w.cur = s
	close(w.changed)
	w.changed = make(chan struct{})
}
