package readme

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
)

// RunHost is the binary name under which the reference shows `run`, the
// command an application's own worker binary adds (Ferry's worker has none).
const RunHost = "your-worker"

// Commands are, per binary, every command and verb whose -h the flag
// reference shows and the docs test reads, in the order of the reference.
// A group (`relay quarantine`) is listed for its usage text, then its verbs.
var Commands = map[string][][]string{
	"relay": {
		{}, {"run"}, {"status"}, {"prune"}, {"recover"},
		{"quarantine"}, {"quarantine", "list"}, {"quarantine", "requeue"}, {"quarantine", "discard"},
		{"migration"}, {"migration", "create"}, {"migration", "list"}, {"migration", "status"},
		{"migration", "request"}, {"migration", "history"},
		{"bridge"}, {"schema"},
	},
	"worker": {
		{}, {"run"}, {"status"}, {"prune"},
		{"dlq"}, {"dlq", "list"}, {"dlq", "redrive"}, {"dlq", "parked", "list"}, {"dlq", "parked", "redrive"},
		{"schema"}, {"migration", "quarantine", "list"}, {"migration", "quarantine", "replay"},
		{"scaffold"},
	},
}

// Help runs `binary words... -h` in this process and returns what it
// prints. The worker's `run` comes from a worker with one handler, as an
// application's binary has it. FERRY_* and OTEL_* variables (but the test
// stack's FERRY_TEST_*) are cleared first, since they would show up as
// defaults.
func Help(binary string, words []string) (string, error) {
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if (strings.HasPrefix(name, "FERRY_") && !strings.HasPrefix(name, "FERRY_TEST_")) || strings.HasPrefix(name, "OTEL_") {
			os.Unsetenv(name)
		}
	}
	var out bytes.Buffer
	args := append(append([]string(nil), words...), "-h")
	var code int
	switch binary {
	case "relay":
		code = relaycli.Main(context.Background(), args, &out, &out)
	case "worker":
		var app *workercli.App
		if len(words) > 0 && words[0] == "run" {
			app = &workercli.App{Name: RunHost, Register: func(w *inbox.Worker) error {
				w.Handle("example", "outbox.event.example", func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
				return nil
			}}
		}
		code = workercli.Main(context.Background(), args, &out, &out, app)
	default:
		return "", fmt.Errorf("no binary %q", binary)
	}
	if code != 0 {
		return "", fmt.Errorf("%s %s -h: exit %d\n%s", binary, strings.Join(words, " "), code, out.String())
	}
	return out.String(), nil
}
