package workercli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/internal/scaffold"
)

// runScaffold writes a new worker from the reserva pattern:
// `worker scaffold NAME --dir PATH`.
func runScaffold(name string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name+" scaffold", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: "+name+" scaffold NAME --dir PATH [--event-type T] [--aggregate-type A] [--ferry-replace CHECKOUT]")
		fs.PrintDefaults()
	}
	dir := fs.String("dir", "", "directory to write the worker into (required; files are never overwritten)")
	eventType := fs.String("event-type", "", `event the handler applies (default "<Name>Requested"); any UTF-8 text without NUL`)
	aggregateType := fs.String("aggregate-type", "", `aggregate type whose topic the worker reads (default "order"); letters, digits, '.', '_', '-'`)
	replace := fs.String("ferry-replace", "", "when PATH is in no Go module: make the new go.mod use this Ferry checkout")
	// NAME may come before or after the flags.
	var worker string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		worker, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return cli.Usage(err)
	}
	if worker == "" && fs.NArg() > 0 {
		worker = fs.Arg(0)
	}
	if worker == "" || *dir == "" {
		fs.Usage()
		return cli.Usagef("NAME and --dir are required")
	}
	res, err := scaffold.Generate(scaffold.Options{
		Name: worker, Dir: *dir, EventType: *eventType, AggregateType: *aggregateType, FerryReplace: *replace,
	})
	if _, ok := errors.AsType[*scaffold.OptionError](err); ok {
		return cli.Usage(err) // a wrong command line: exit 2
	}
	if err != nil {
		return err
	}
	for _, f := range res.Files {
		fmt.Fprintln(stdout, "wrote", f)
	}
	fmt.Fprintf(stdout, "package %s; run its test with: cd %s && go test ./...\n", res.ImportPath, *dir)
	return nil
}
