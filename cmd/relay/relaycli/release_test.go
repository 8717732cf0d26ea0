//go:build !ferryfault

package relaycli_test

import (
	"testing"

	"github.com/ferryhq/ferry/internal/cli/clitest"
)

// A release relay has no flag that loses data on purpose: the negative
// control's --unsafe-confirm-on-send exists only in ferryfault builds,
// the fault suite's.
func TestReleaseRunHasNoNegativeControl(t *testing.T) {
	t.Parallel()
	clitest.VerbHelpListsItsOwnFlags(t, "relay", relay(t), []clitest.Verb{
		{Args: []string{"run", "-h"}, Want: []string{"-slot"}, Never: []string{"-unsafe-confirm-on-send", "-unsafe-no-mandatory"}},
	})
}
