package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Flags is a subcommand's flag set in which every setting registered
// through its methods can also come from the environment: --kafka-brokers
// reads FERRY_KAFKA_BROKERS (see EnvName). A flag on the command line wins
// over the environment. A malformed value in either is a usage error that
// names it; an empty environment variable counts as unset.
//
// Flags registered on the embedded *flag.FlagSet directly have no variable:
// Ferry keeps it that way for one-off selections (--id, --all) and for the
// negative controls, which must never be switched on by an environment.
type Flags struct {
	*flag.FlagSet
	envErrs []error
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

// Parse parses args, then reports the first malformed environment variable.
// Every error but a request for help wraps ErrUsage.
func (f *Flags) Parse(args []string) error {
	if err := f.FlagSet.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return Usage(err)
	}
	if len(f.envErrs) > 0 {
		return Usage(f.envErrs[0])
	}
	return nil
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

// BoolVar is flag.BoolVar with the flag's environment variable.
func (f *Flags) BoolVar(p *bool, name string, def bool, usage string) {
	f.FlagSet.BoolVar(p, name, def, usage+" (env "+EnvName(name)+")")
	f.fromEnv(name)
}

// Bool is flag.Bool with the flag's environment variable.
func (f *Flags) Bool(name string, def bool, usage string) *bool {
	p := new(bool)
	f.BoolVar(p, name, def, usage)
	return p
}

// Int is flag.Int with the flag's environment variable.
func (f *Flags) Int(name string, def int, usage string) *int {
	p := new(int)
	f.FlagSet.IntVar(p, name, def, usage+" (env "+EnvName(name)+")")
	f.fromEnv(name)
	return p
}

// Duration is a duration flag with the flag's environment variable. It
// also takes whole days ("7d"), since retention windows are counted in days.
func (f *Flags) Duration(name string, def time.Duration, usage string) *time.Duration {
	v := &DurationValue{D: def}
	f.Var(v, name, usage)
	return &v.D
}

func (f *Flags) fromEnv(name string) {
	env := EnvName(name)
	s := os.Getenv(env)
	if s == "" {
		return
	}
	if err := f.FlagSet.Set(name, s); err != nil {
		f.envErrs = append(f.envErrs, fmt.Errorf("%s (--%s): %w", env, name, err))
	}
}
