package relay

import (
	"context"
	"time"
)

// pendingCall is work the replication loop waits for without doing it: the
// Kafka calls of a live migration (a step's new channel and the partitions
// of the topics it fences, the partitions of a topic fenced at its first
// event) and the database calls around them. Any of them may take longer
// than PostgreSQL allows between two status updates (Config.ServerTimeout),
// so it runs on a goroutine of its own while the loop reads no further WAL,
// which keeps the step at its exact point of the commit order and the
// event before its fences, and goes on sending status updates. Once the
// work is done its continuation runs in the loop.
//
// While it runs, the work owns the session's route (s.route, s.step,
// s.routeSeq and the router's maps); the loop touches only the connection,
// the tracker and what it reports. The loop does not beat the relay's
// heartbeat meanwhile: the work beats as it makes progress, so that one of
// its calls that never returns still shows in Relay.Healthy.
type pendingCall struct {
	done   chan struct{}
	cancel context.CancelFunc
	err    error        // the work's, set before done closes
	then   func() error // runs in the loop once the work returned nil; may be nil
}

// await runs work off the loop; then, if not nil, runs in the loop once work
// returned nil. The loop reads no further until both are done.
func (s *session) await(work func(ctx context.Context) error, then func() error) {
	ctx, cancel := context.WithCancel(s.sctx)
	c := &pendingCall{done: make(chan struct{}), cancel: cancel, then: then}
	s.pending = c
	go func() {
		defer close(c.done)
		s.r.heartbeat()
		c.err = work(ctx)
	}()
}

// waitPending waits for the pending call until deadline, a failure of the
// session or stopping. It reports whether the call ended, and its error or
// its continuation's.
func (s *session) waitPending(deadline time.Time, stopping <-chan struct{}) (bool, error) {
	c := s.pending
	timer := time.NewTimer(max(time.Until(deadline), 0))
	defer timer.Stop()
	select {
	case <-c.done:
	case <-s.failed:
		return false, nil
	case <-stopping:
		return false, nil
	case <-timer.C:
		return false, nil
	}
	s.pending = nil
	c.cancel()
	if c.err != nil || c.then == nil {
		return true, c.err
	}
	return true, c.then()
}

// abandonPending cancels the pending call, if any, and waits for its work to
// end: nothing of it runs once the session is over.
func (s *session) abandonPending() {
	c := s.pending
	if c == nil {
		return
	}
	s.pending = nil
	c.cancel()
	<-c.done
}
