package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Flags is a subcommand's flag set in which every setting registered
// through its methods can also come from the environment: --kafka-brokers
// reads FERRY_KAFKA_BROKERS (see EnvName). A flag on the command line wins
// over the environment. A malformed value in either is a usage error that
// names it; an empty environment variable counts as unset, except for a
// setting whose empty value means something (StringEmptyIsValue).
//
// Flags registered on the embedded *flag.FlagSet directly have no variable:
// Ferry keeps it that way for one-off selections (--id, --all) and for the
// negative controls, which must never be switched on by an environment.
type Flags struct {
	*flag.FlagSet
	envErrs []error
	maxArgs int
	args    []string
}

// NewFlags returns the flag set of subcommand name ("relay run"), printing
// its help and parse errors to stderr.
func NewFlags(name string, stderr io.Writer) *Flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &Flags{FlagSet: fs}
}

// EnvName is the environment variable of a flag: "kafka-brokers" is
// FERRY_KAFKA_BROKERS.
func EnvName(flagName string) string {
	return "FERRY_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// TakesArgs lets the command take up to n arguments besides its flags
// (`migrate down`). Without it an argument is a usage error.
func (f *Flags) TakesArgs(n int) { f.maxArgs = n }

// Parse parses args, then reports the first malformed environment variable.
// Flags may come before, between and after the arguments: the flag package
// alone stops at the first argument, and the flags after it, such as the
// --database-url of `migrate down --database-url B`, would be ignored in
// silence. After "--" everything is an argument. More arguments than
// TakesArgs allows are refused by name. Every error but a request for help
// wraps ErrUsage.
func (f *Flags) Parse(args []string) error {
	f.args = nil
	for {
		if err := f.FlagSet.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return Usage(err)
		}
		rest := f.FlagSet.Args()
		if len(rest) == 0 {
			break
		}
		if len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			f.args = append(f.args, rest...)
			break
		}
		f.args = append(f.args, rest[0])
		args = rest[1:]
	}
	switch {
	case len(f.args) > f.maxArgs && f.maxArgs == 0:
		return Usagef("unexpected argument %q: %s takes flags only", f.args[0], f.Name())
	case len(f.args) > f.maxArgs:
		return Usagef("unexpected argument %q: %s takes at most %d", f.args[f.maxArgs], f.Name(), f.maxArgs)
	}
	if len(f.envErrs) > 0 {
		return Usage(f.envErrs[0])
	}
	return nil
}

// Args are the arguments besides the flags, wherever they stood.
func (f *Flags) Args() []string { return f.args }

// NArg is len(Args()).
func (f *Flags) NArg() int { return len(f.args) }

// Arg is the i-th argument, or "" when there is none.
func (f *Flags) Arg(i int) string {
	if i < 0 || i >= len(f.args) {
		return ""
	}
	return f.args[i]
}

// Var registers v as flag name with its environment variable.
func (f *Flags) Var(v flag.Value, name, usage string) {
	f.FlagSet.Var(v, name, usage+" (env "+EnvName(name)+")")
	f.fromEnv(name)
}

// StringVar is flag.StringVar with the flag's environment variable.
func (f *Flags) StringVar(p *string, name, def, usage string) {
	f.FlagSet.StringVar(p, name, def, usage+" (env "+EnvName(name)+")")
	f.fromEnv(name)
}

// String is flag.String with the flag's environment variable.
func (f *Flags) String(name, def, usage string) *string {
	p := new(string)
	f.StringVar(p, name, def, usage)
	return p
}

// StringEmptyIsValue is String for a setting whose empty value means
// something, which its command then refuses (--dlq-suffix ""): its
// variable set to "" is that empty value, not unset, so that
// FERRY_DLQ_SUFFIX="" is refused as the flag is instead of quietly
// taking the default. Only an unset variable leaves the default.
func (f *Flags) StringEmptyIsValue(name, def, usage string) *string {
	p := new(string)
	f.FlagSet.StringVar(p, name, def, usage+" (env "+EnvName(name)+")")
	if s, ok := os.LookupEnv(EnvName(name)); ok {
		f.setFromEnv(name, s)
	}
	return p
}

// BoolVar is flag.BoolVar with the flag's environment variable. A value
// that is no boolean is refused with the values it takes (see BoolValue).
func (f *Flags) BoolVar(p *bool, name string, def bool, usage string) {
	*p = def
	f.Var((*boolRef)(p), name, usage)
}

// boolRef is a BoolValue that writes to the caller's bool.
type boolRef bool

func (b *boolRef) String() string   { return strconv.FormatBool(b != nil && bool(*b)) }
func (b *boolRef) IsBoolFlag() bool { return true }
func (b *boolRef) Set(s string) error {
	var v BoolValue
	if err := v.Set(s); err != nil {
		return err
	}
	*b = boolRef(v.B)
	return nil
}

// Bool is flag.Bool with the flag's environment variable.
func (f *Flags) Bool(name string, def bool, usage string) *bool {
	p := new(bool)
	f.BoolVar(p, name, def, usage)
	return p
}

// Int is flag.Int with the flag's environment variable. A value that is
// no whole number is refused saying so (see IntValue).
func (f *Flags) Int(name string, def int, usage string) *int {
	v := &IntValue{N: def}
	f.Var(v, name, usage)
	return &v.N
}

// Count is an int flag of at least 1 (see CountValue) with the flag's
// environment variable.
func (f *Flags) Count(name string, def int, usage string) *int {
	v := &CountValue{N: def}
	f.Var(v, name, usage)
	return &v.N
}

// PositiveDuration is Duration for a span that must be positive: an
// engine's Config reads 0 as "use the default".
func (f *Flags) PositiveDuration(name string, def time.Duration, usage string) *time.Duration {
	v := &DurationValue{D: def, Positive: true}
	f.Var(v, name, usage)
	return &v.D
}

// Duration is a duration flag with the flag's environment variable. It
// also takes whole days ("7d"), since retention windows are counted in days.
func (f *Flags) Duration(name string, def time.Duration, usage string) *time.Duration {
	v := &DurationValue{D: def}
	f.Var(v, name, usage)
	return &v.D
}

func (f *Flags) fromEnv(name string) {
	if s := os.Getenv(EnvName(name)); s != "" {
		f.setFromEnv(name, s)
	}
}

func (f *Flags) setFromEnv(name, s string) {
	if err := f.FlagSet.Set(name, s); err != nil {
		f.envErrs = append(f.envErrs, fmt.Errorf("%s (--%s): %w", EnvName(name), name, err))
	}
}
