//go:build ferryfault

package relaycli

import (
	"flag"
	"log/slog"

	"github.com/ferryhq/ferry/relay"
)

// The fault suite builds its relay with the ferryfault tag, which adds the
// negative control's flag to `relay run`. A release binary has no such flag.
func init() {
	negativeControls = func(fs *flag.FlagSet) func(*relay.Config, *slog.Logger) {
		confirm := fs.Bool("unsafe-confirm-on-send", false, "NEGATIVE CONTROL ONLY: confirm WAL before Kafka acknowledges, which loses events on a crash")
		return func(cfg *relay.Config, logger *slog.Logger) {
			if *confirm {
				relay.UnsafeConfirmOnSend(cfg)
				logger.Warn("NEGATIVE CONTROL: --unsafe-confirm-on-send confirms WAL before Kafka acknowledges; events will be lost on a crash")
			}
		}
	}
}
