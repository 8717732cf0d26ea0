// Command reserva-worker runs reserva's consumers (stock.reservation and
// order.status) on Ferry's worker command line, exactly as a worker written
// by `worker scaffold` does:
//
//	reserva-worker migrate   Ferry's tables, then reserva's
//	reserva-worker run       consume until SIGTERM (flags: reserva-worker run -h)
//
// Every other command (status, prune, dlq list, dlq redrive) is Ferry's.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/schema"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := workercli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, &workercli.App{
		Name:       "reserva-worker",
		Register:   reserva.Register,
		Migrations: []schema.Set{reserva.Migrations},
	})
	stop()
	os.Exit(code)
}
