package cli

import (
	"errors"
	"fmt"
)

// ErrUsage marks a wrong command line: an unknown subcommand or flag, a
// missing or malformed setting, a setting an engine's validation refuses.
// Dispatch exits 2 for errors that wrap it, 1 for every other failure.
var ErrUsage = errors.New("usage")

type usageError struct{ err error }

func (e usageError) Error() string   { return e.err.Error() }
func (e usageError) Unwrap() []error { return []error{e.err, ErrUsage} }

// Usage marks err as a wrong command line (exit 2). Usage(nil) is nil.
func Usage(err error) error {
	if err == nil || errors.Is(err, ErrUsage) {
		return err
	}
	return usageError{err}
}

// Usagef is Usage(fmt.Errorf(format, args...)).
func Usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}
