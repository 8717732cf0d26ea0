// Command ferrybench measures Ferry against ceilings taken in the same run
// on the same machine, and prints markdown tables.
//
//	eval "$(scripts/stack up)"
//	go run ./internal/ferrybench relay [-events 1000000] [-runs 3]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: ferrybench relay [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "relay":
		fs := flag.NewFlagSet("relay", flag.ExitOnError)
		var o relayOpts
		fs.IntVar(&o.events, "events", 1_000_000, "backlog size drained by the relay")
		fs.IntVar(&o.runs, "runs", 3, "measurements of each figure; the median is reported")
		fs.IntVar(&o.rate, "rate", 1000, "events per second offered in the latency phase")
		fs.DurationVar(&o.latencyFor, "latency-duration", 15_000_000_000, "length of the latency phase")
		fs.IntVar(&o.payload, "payload", 200, "payload bytes per event")
		_ = fs.Parse(os.Args[2:])
		err = benchRelay(ctx, o, os.Stdout)
	default:
		err = fmt.Errorf("unknown benchmark %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferrybench:", err)
		os.Exit(1)
	}
}
