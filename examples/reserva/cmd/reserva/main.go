// Command reserva runs the reserva example's order API, applies its
// migrations, and runs the whole demo.
//
//	reserva migrate            Ferry's and reserva's tables, the relay's slot, demo stock
//	reserva api [-addr :8080]  the order service
//	reserva demo [-once]       everything at once, with a summary (see make demo;
//	                           -broker rabbitmq runs it over RabbitMQ)
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ferryhq/ferry/examples/reserva/internal/demo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := demo.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
