//go:build ferryfault

package relay

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A relay built with the ferryfault tag (only the fault suite builds it)
// can be made to see a partition that stops acknowledging, against a real
// broker: on SIGUSR1 it keeps back Kafka's answers for partition 0 of every
// topic (the records are written; the relay is not told), on SIGUSR2 it
// hands them over in order and stops holding. Nothing else changes.
func init() {
	h := &ackHolder{}
	faultHoldAck = h.hold
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for s := range sig {
			if s == syscall.SIGUSR1 {
				h.start()
			} else {
				h.release()
			}
		}
	}()
}

type ackHolder struct {
	mu      sync.Mutex
	holding bool
	held    []func()
}

func (h *ackHolder) hold(r *kgo.Record, err error, promise func(*kgo.Record, error)) bool {
	if r.Partition != 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.holding {
		return false
	}
	h.held = append(h.held, func() { promise(r, err) })
	return true
}

func (h *ackHolder) start() {
	h.mu.Lock()
	h.holding = true
	h.mu.Unlock()
}

// release answers the held records in the order Kafka answered them;
// answers arriving meanwhile wait for the lock, so the partition's order
// holds.
func (h *ackHolder) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holding = false
	for _, f := range h.held {
		f()
	}
	h.held = nil
}
