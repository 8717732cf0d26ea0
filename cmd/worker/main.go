// Command worker is Ferry's worker binary for the operations that need no
// handler: consumer status, inbox pruning, dead-letter listing and redrive,
// migrations, scaffolding. See `worker help`.
//
// The worker that applies your messages is your own binary: the same
// command line (package workercli) with your handlers and migrations, which
// adds `run`. `worker scaffold NAME --dir PATH` writes one;
// examples/reserva/cmd/reserva-worker is reserva's.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := workercli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	stop()
	os.Exit(code)
}
