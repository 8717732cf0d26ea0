// Command worker consumes Ferry's topics and applies each message exactly
// once through the inbox. See `worker help`.
//
// `worker run` hosts the handlers of the reserva example (consumers
// stock.reservation and order.status), so the demo works out of the box.
// Your own worker is this file with your handlers in place of
// reserva.Register: `worker scaffold NAME --dir PATH` writes one.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/inbox/workercmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := workercmd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, reserva.Register)
	stop()
	os.Exit(code)
}
