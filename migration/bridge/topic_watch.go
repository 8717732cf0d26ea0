package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// topicWatch checks, every interval, that the topics the bridge was told
// to copy (Config.Topics) exist on the old cluster. A consumer group
// subscribed to a topic that does not exist waits for it in silence, and
// the bridge would look idle: the watch says which topics are missing at
// every check until they exist, and the bridge is not ready meanwhile.
type topicWatch struct {
	adm      *kadm.Client
	topics   []string
	interval time.Duration
	log      *slog.Logger
	state    atomic.Pointer[topicState]
}

// topicState is what the last check found.
type topicState struct {
	missing  []string          // not on the old cluster
	unusable map[string]string // there, but not readable: topic -> why
	err      error             // the old cluster did not answer
}

// problem is why the topics cannot all be copied; nil when they can.
func (st *topicState) problem() error {
	switch {
	case st == nil:
		return errors.New("bridge: the old channel's topics are not checked yet")
	case st.err != nil:
		return fmt.Errorf("bridge: cannot check the old channel's topics: %w", st.err)
	case len(st.missing) > 0:
		return fmt.Errorf("bridge: topic %s does not exist on the old channel: nothing of it is copied until it does (create it, or fix Config.Topics)",
			strings.Join(st.missing, ", "))
	case len(st.unusable) > 0:
		var parts []string
		for _, t := range slices.Sorted(maps.Keys(st.unusable)) {
			parts = append(parts, t+": "+st.unusable[t])
		}
		return fmt.Errorf("bridge: topics of the old channel that cannot be read: %s", strings.Join(parts, "; "))
	}
	return nil
}

// run checks at once, then every interval, until ctx ends.
func (w *topicWatch) run(ctx context.Context) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		w.check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// check asks the old cluster for the topics' metadata (which never creates
// one) and logs what is wrong: a missing or unreadable topic at every
// check, an old cluster that does not answer once until it does.
func (w *topicWatch) check(ctx context.Context) {
	tds, err := w.adm.ListTopics(ctx, w.topics...)
	if ctx.Err() != nil {
		return
	}
	prev := w.state.Load()
	st := &topicState{err: err, unusable: map[string]string{}}
	if err == nil {
		for _, t := range w.topics {
			td, ok := tds[t]
			switch {
			case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition):
				st.missing = append(st.missing, t)
			case td.Err != nil:
				st.unusable[t] = td.Err.Error()
			}
		}
	}
	w.state.Store(st)
	switch {
	case err != nil:
		if prev == nil || prev.err == nil {
			w.log.Warn("cannot check the old channel's topics; retrying", slog.String("error", err.Error()),
				slog.Duration("every", w.interval))
		}
		return
	case len(st.missing) > 0:
		w.log.Error("topics to copy do not exist on the old channel: nothing of them is copied until they do; "+
			"create them, or fix the topics the bridge copies", slog.Any("missing_topics", st.missing),
			slog.Duration("checked_every", w.interval))
	}
	for t, why := range st.unusable {
		w.log.Error("a topic to copy cannot be read on the old channel", slog.String("topic", t), slog.String("error", why))
	}
	if prev != nil {
		for _, t := range prev.missing {
			if !slices.Contains(st.missing, t) && st.err == nil {
				w.log.Info("a topic to copy exists on the old channel now", slog.String("topic", t))
			}
		}
	}
}
