package workercli_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

// Asking a command group for help (`worker migration quarantine -h`) is
// not a wrong command line: it prints the group's usage on stdout, no
// error, and exits 0, as `worker help` does.
func TestCommandGroupHelpExitsZero(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"migration", "-h"}, "migration quarantine replay"},
		{[]string{"migration", "quarantine", "-h"}, "migration quarantine replay"},
		{[]string{"migration", "quarantine", "--help"}, "migration quarantine replay"},
		{[]string{"migration", "quarantine", "help"}, "migration quarantine replay"},
		{[]string{"dlq", "-h"}, "dlq redrive --topic T"},
		{[]string{"dlq", "parked", "-h"}, "dlq parked redrive"},
	} {
		code, stdout, stderr := run(context.Background(), nil, c.args...)
		if code != 0 || !strings.Contains(stdout, c.want) || stderr != "" {
			t.Errorf("worker %v: exit %d\nstdout %q\nstderr %q\nwant exit 0, the usage (%q) on stdout and nothing on stderr",
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
		{[]string{"migration", "quarantine", "list", "-h"}, []string{"-consumer", "-database-url"}, []string{"-all", "-id", "-kafka-brokers"}},
		{[]string{"migration", "quarantine", "replay", "-h"}, []string{"-consumer", "-all", "-id", "-kafka-brokers"}, nil},
		{[]string{"dlq", "list", "-h"}, []string{"-topic", "-id"}, []string{"-all"}},
		{[]string{"dlq", "redrive", "-h"}, []string{"-topic", "-id", "-all"}, nil},
		{[]string{"dlq", "parked", "list", "-h"}, []string{"-consumer", "-limit"}, []string{"-all", "-kafka-brokers"}},
		{[]string{"dlq", "parked", "redrive", "-h"}, []string{"-consumer", "-all", "-kafka-brokers"}, nil},
	} {
		code, _, stderr := run(context.Background(), nil, c.args...)
		if code != 0 {
			t.Errorf("worker %v: exit %d, want 0\n%s", c.args, code, stderr)
		}
		lists := func(f string) bool { return regexp.MustCompile(`(?m)^  ` + f + `( |$)`).MatchString(stderr) }
		for _, f := range c.want {
			if !lists(f) {
				t.Errorf("worker %v does not list %s:\n%s", c.args, f, stderr)
			}
		}
		for _, f := range c.never {
			if lists(f) {
				t.Errorf("worker %v lists %s, which it does not take:\n%s", c.args, f, stderr)
			}
		}
	}
}
