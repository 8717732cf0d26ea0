package workercli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `worker scaffold` refuses what would make a worker that does not build, or
// be written outside --dir, with an error naming the flag: a wrong NAME or
// flag value exits 2, as every wrong command line does.
func TestScaffoldRefusalsNameTheFlag(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"func"}, "NAME"},
		{[]string{"main"}, "NAME"},
		{[]string{"audit", "--event-type", "Bad\x00Type"}, "--event-type"},
		{[]string{"audit", "--aggregate-type", `order"; panic(1) //`}, "--aggregate-type"},
	} {
		args := append([]string{"scaffold"}, c.args...)
		code, _, stderr := run(context.Background(), nil, append(args, "--dir", t.TempDir())...)
		if code != 2 || !strings.Contains(stderr, c.flag) {
			t.Errorf("%q: exit %d, %q; want exit 2 naming %s", c.args, code, stderr, c.flag)
		}
	}

	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "go.mod")
	if err := os.Symlink(outside, filepath.Join(dir, "go.mod")); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := run(context.Background(), nil, "scaffold", "audit", "--dir", dir)
	if code != 1 || !strings.Contains(stderr, "--dir") || !strings.Contains(stderr, "go.mod") {
		t.Errorf("a dangling go.mod symlink in --dir: exit %d, %q; want exit 1 naming --dir and go.mod", code, stderr)
	}
	if _, err := os.Lstat(outside); err == nil {
		t.Errorf("scaffold wrote %s through the symlink", outside)
	}
}
