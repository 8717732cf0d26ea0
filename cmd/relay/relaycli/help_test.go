package relaycli_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

// Asking a command group for help (`relay quarantine -h`) is not a wrong
// command line: it prints the group's usage on stdout and exits 0, as
// `relay help` does.
func TestCommandGroupHelpExitsZero(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"quarantine", "-h"}, "relay quarantine requeue"},
		{[]string{"quarantine", "--help"}, "relay quarantine discard"},
		{[]string{"migration", "-h"}, "relay migration request NAME PHASE"},
		{[]string{"migration", "help"}, "relay migration history NAME"},
	} {
		code, stdout, stderr := run(t, context.Background(), c.args...)
		if code != 0 || !strings.Contains(stdout, c.want) || stderr != "" {
			t.Errorf("relay %v: exit %d\nstdout %q\nstderr %q\nwant exit 0, the usage (%q) on stdout and nothing on stderr",
				c.args, code, stdout, stderr, c.want)
		}
	}
}

// Each verb's -h lists the flags it takes, not those of another verb.
func TestVerbHelpListsItsOwnFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args        []string
		want, never []string
	}{
		{[]string{"quarantine", "list", "-h"}, []string{"-limit", "-database-url"}, []string{"-all", "-id"}},
		{[]string{"quarantine", "requeue", "-h"}, []string{"-all", "-id"}, []string{"-limit"}},
		{[]string{"quarantine", "discard", "-h"}, []string{"-all", "-id"}, []string{"-limit"}},
	} {
		code, _, stderr := run(t, context.Background(), c.args...)
		if code != 0 {
			t.Errorf("relay %v: exit %d, want 0\n%s", c.args, code, stderr)
		}
		lists := func(f string) bool { return regexp.MustCompile(`(?m)^  ` + f + `( |$)`).MatchString(stderr) }
		for _, f := range c.want {
			if !lists(f) {
				t.Errorf("relay %v does not list %s:\n%s", c.args, f, stderr)
			}
		}
		for _, f := range c.never {
			if lists(f) {
				t.Errorf("relay %v lists %s, which it does not take:\n%s", c.args, f, stderr)
			}
		}
	}
}
