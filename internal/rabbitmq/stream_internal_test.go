package rabbitmq

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The refusals a stream's consume is tried again after are the broker's
// passing ones, wrapped as readStreamFrom wraps them; any other error
// returns at once.
func TestStreamConsumeTransient(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("read stream s: %w", &amqp.Error{Code: amqp.InternalError, Reason: "INTERNAL_ERROR"}), true},
		{fmt.Errorf("read stream s: %w", &amqp.Error{Code: amqp.PreconditionFailed,
			Reason: "PRECONDITION_FAILED - queue 'queue 's' in vhost 'ferry'' does not have a replica on the local node"}), true},
		{fmt.Errorf("read stream s: %w", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - inequivalent arg"}), false},
		{fmt.Errorf("read stream s: %w", &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED"}), false},
		{fmt.Errorf("stream s does not exist"), false},
		{nil, false},
	} {
		if got := streamConsumeTransient(c.err); got != c.want {
			t.Errorf("streamConsumeTransient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
