package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

// Command is one subcommand of a binary: args are those after its name.
type Command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// Dispatch runs the subcommand args[0] of prog and returns the exit code,
// by one rule for every Ferry binary: 0 on success or help; 2 for a wrong
// command line (no or unknown subcommand, or an error wrapping ErrUsage:
// see Usage); 1 for every other failure. Errors are printed as
// "prog sub: error". Every binary answers `version` (and --version) with
// its name and Version on stdout.
func Dispatch(ctx context.Context, prog, usage string, cmds map[string]Command, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	if IsHelp(args[0]) {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if IsVersion(args[0]) {
		switch {
		case len(args) == 1:
			fmt.Fprintf(stdout, "%s %s\n", prog, Version())
			return 0
		case len(args) == 2 && IsHelp(args[1]):
			fmt.Fprintf(stdout, "Usage: %s version\n\nPrints the version, commit and Go release the binary was built from.\n", prog)
			return 0
		}
		fmt.Fprintf(stderr, "%s %s: takes no arguments, got %q\n", prog, args[0], args[1:])
		return 2
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", prog, args[0], usage)
		return 2
	}
	err := cmd(ctx, args[1:], stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "%s %s: %v\n", prog, args[0], err)
		return 2
	}
	fmt.Fprintf(stderr, "%s %s: %v\n", prog, args[0], err)
	return 1
}

// IsHelp reports whether arg, where a subcommand is expected, asks for
// help: "help", or -h and -help with one or two dashes, as the flag
// package reads them. A command group (`dlq`, `migration quarantine`)
// answers it with its usage on stdout and exit 0, as Dispatch does.
func IsHelp(arg string) bool {
	switch arg {
	case "help", "-h", "--h", "-help", "--help":
		return true
	}
	return false
}
