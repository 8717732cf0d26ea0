// Package clitest holds the checks both command lines' tests make of
// their help.
package clitest

import (
	"regexp"
	"strings"
	"testing"
)

// Run runs the command line with args and returns its exit code, stdout
// and stderr.
type Run func(args ...string) (code int, stdout, stderr string)

// Group is a command group's help request and a line its usage holds.
type Group struct {
	Args []string
	Want string
}

// GroupHelpExitsZero checks that each group's help request prints the
// group's usage on stdout, nothing on stderr, and exits 0: asking for help
// is not a wrong command line.
func GroupHelpExitsZero(t *testing.T, binary string, run Run, groups []Group) {
	t.Helper()
	for _, g := range groups {
		code, stdout, stderr := run(g.Args...)
		if code != 0 || !strings.Contains(stdout, g.Want) || stderr != "" {
			t.Errorf("%s %v: exit %d\nstdout %q\nstderr %q\nwant exit 0, the usage (%q) on stdout and nothing on stderr",
				binary, g.Args, code, stdout, stderr, g.Want)
		}
	}
}

// Verb is a verb's help request, the flags it takes and flags of other
// verbs it does not take.
type Verb struct {
	Args        []string
	Want, Never []string
}

// VerbHelpListsItsOwnFlags checks that each verb's -h exits 0 and lists
// the flags it takes and none of those it does not.
func VerbHelpListsItsOwnFlags(t *testing.T, binary string, run Run, verbs []Verb) {
	t.Helper()
	for _, v := range verbs {
		code, _, stderr := run(v.Args...)
		if code != 0 {
			t.Errorf("%s %v: exit %d, want 0\n%s", binary, v.Args, code, stderr)
		}
		lists := func(f string) bool {
			return regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(f) + `( |$)`).MatchString(stderr)
		}
		for _, f := range v.Want {
			if !lists(f) {
				t.Errorf("%s %v does not list %s:\n%s", binary, v.Args, f, stderr)
			}
		}
		for _, f := range v.Never {
			if lists(f) {
				t.Errorf("%s %v lists %s, which it does not take:\n%s", binary, v.Args, f, stderr)
			}
		}
	}
}
