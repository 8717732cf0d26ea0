package workercli_test

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/internal/cli"
)

// `worker version` and `worker --version` print the build's version on
// stdout and exit 0, under the application's name in its own worker;
// arguments after it are a wrong command line.
func TestVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if !strings.Contains(cli.Version(), runtime.Version()) {
		t.Fatalf("version %q does not name the Go release %s", cli.Version(), runtime.Version())
	}
	for _, app := range []*workercli.App{nil, {Name: "billing-worker"}} {
		name := "worker"
		if app != nil {
			name = app.Name
		}
		want := name + " " + cli.Version() + "\n"
		for _, arg := range []string{"version", "--version", "-version"} {
			code, stdout, stderr := run(ctx, app, arg)
			if code != 0 || stdout != want || stderr != "" {
				t.Errorf("%s %s: exit %d, stdout %q, stderr %q; want exit 0 and %q", name, arg, code, stdout, stderr, want)
			}
		}
		if code, stdout, stderr := run(ctx, app, "version", "x"); code != 2 || stdout != "" || !strings.Contains(stderr, "takes no arguments") {
			t.Errorf("%s version x: exit %d, stdout %q, stderr %q; want exit 2 and a refusal", name, code, stdout, stderr)
		}
		if _, stdout, _ := run(ctx, app, "help"); !strings.Contains(stdout, name+" version ") {
			t.Errorf("%s help does not list version:\n%s", name, stdout)
		}
	}
}
