//go:build ferryfault

package relaycli_test

import (
	"testing"

	"github.com/ferryhq/ferry/internal/cli/clitest"
)

// The fault suite's relay, built with the ferryfault tag, takes the
// negative control's flag.
func TestFaultBuildRunHasTheNegativeControl(t *testing.T) {
	t.Parallel()
	clitest.VerbHelpListsItsOwnFlags(t, "relay", relay(t), []clitest.Verb{
		{Args: []string{"run", "-h"}, Want: []string{"-slot", "-unsafe-confirm-on-send", "-unsafe-no-mandatory"}},
	})
}
