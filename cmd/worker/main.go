// Command worker consumes Ferry's topics and applies each message exactly
// once through the inbox. See `worker help`.
//
// This binary hosts no handlers of its own: `worker run` needs a main that
// registers them (see package workercmd). Its other commands (prune, dlq,
// migrate) work as they are.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferryhq/ferry/inbox/workercmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := workercmd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
