package relaycli_test

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/cli"
)

// `relay version` and `relay --version` print the build's version on
// stdout and exit 0; arguments after it are a wrong command line.
func TestVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	want := "relay " + cli.Version() + "\n"
	if !strings.Contains(want, runtime.Version()) {
		t.Fatalf("version %q does not name the Go release %s", want, runtime.Version())
	}
	for _, arg := range []string{"version", "--version", "-version"} {
		code, stdout, stderr := run(t, ctx, arg)
		if code != 0 || stdout != want || stderr != "" {
			t.Errorf("relay %s: exit %d, stdout %q, stderr %q; want exit 0 and %q", arg, code, stdout, stderr, want)
		}
	}
	if code, stdout, stderr := run(t, ctx, "version", "--json"); code != 2 || stdout != "" || !strings.Contains(stderr, "takes no arguments") {
		t.Errorf("relay version --json: exit %d, stdout %q, stderr %q; want exit 2 and a refusal", code, stdout, stderr)
	}
	if code, stdout, _ := run(t, ctx, "version", "-h"); code != 0 || !strings.Contains(stdout, "Usage: relay version") {
		t.Errorf("relay version -h: exit %d, stdout %q; want exit 0 and its usage", code, stdout)
	}
	if _, stdout, _ := run(t, ctx, "help"); !strings.Contains(stdout, "relay version ") {
		t.Errorf("relay help does not list version:\n%s", stdout)
	}
}
