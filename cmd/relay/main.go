// Command relay tails PostgreSQL's write-ahead log and publishes Ferry's
// outbox events to Kafka. See `relay help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := relaycli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
