package bridge

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitAnswers returns once its time is up, with the copies still
// unanswered, however the scheduler interleaves it with its timer. Before,
// it took its deadline after it started the timer: preempted in between,
// it found the timer's wake-up gone before it waited, a deadline still
// ahead, and waited for ever (a bridge whose new cluster was unreachable
// never returned from Run: TestNoOffsetIsCommittedWithoutTheNewClustersAck
// hung for 11 minutes under make test-race).
func TestWaitAnswersReturnsWhenItsTimeIsUp(t *testing.T) {
	t.Parallel()
	var stop atomic.Bool
	defer stop.Store(true)
	for range runtime.GOMAXPROCS(0) * 2 { // preemption between the timer and the deadline
		go func() {
			for spins := 0; !stop.Load(); spins++ {
			}
		}()
	}
	for i := range 1000 {
		s := &session{}
		s.answered = sync.NewCond(&s.mu)
		tr := newCommitTracker()
		tr.add(1, 0)
		parts := map[topicPartition]*commitTracker{{"t", 0}: tr}
		done := make(chan int, 1)
		go func() { done <- s.waitAnswers(parts, time.Duration(i%3)*time.Microsecond) }()
		select {
		case n := <-done:
			if n != 1 {
				t.Fatalf("waitAnswers returned %d unanswered, want 1", n)
			}
		case <-time.After(30 * time.Second): // a correct wait returns within microseconds
			t.Fatalf("waitAnswers(%s) still waits after 30s, on try %d", time.Duration(i%3)*time.Microsecond, i)
		}
	}
}
