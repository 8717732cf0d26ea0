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
		noMandatory := fs.Bool("unsafe-no-mandatory", false, "NEGATIVE CONTROL ONLY: publish to RabbitMQ without mandatory, so an unroutable event is acknowledged and dropped")
		return func(cfg *relay.Config, logger *slog.Logger) {
			if *noMandatory {
				relay.UnsafeRabbitMQNoMandatory(cfg)
				logger.Warn("NEGATIVE CONTROL: --unsafe-no-mandatory publishes without mandatory; unroutable events will be lost")
			}
			if *confirm && cfg.RabbitMQ != nil {
				// On RabbitMQ: success once the publish is written,
				// before the broker's confirmation.
				relay.UnsafeRabbitMQConfirmOnSend(cfg)
				logger.Warn("NEGATIVE CONTROL: --unsafe-confirm-on-send counts a publish as acknowledged once written, before RabbitMQ confirms it; events will be lost when the broker dies")
				return
			}
			if *confirm {
				relay.UnsafeConfirmOnSend(cfg)
				logger.Warn("NEGATIVE CONTROL: --unsafe-confirm-on-send confirms WAL before Kafka acknowledges; events will be lost on a crash")
			}
		}
	}
}
