// Command relay tails PostgreSQL's write-ahead log and publishes Ferry's
// outbox events to Kafka. See `relay help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
)

func main() {
	// `relay run` runs its Go code on one P unless GOMAXPROCS says
	// otherwise: one walsender feeds it, and on one P its goroutines hand
	// records to each other without waking threads on other cores (a
	// drain 1.6 times as fast, and less CPU per event at low rates;
	// docs/relay.md#cpu).
	if len(os.Args) > 1 && os.Args[1] == "run" && os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := relaycli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
