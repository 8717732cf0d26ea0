package readme_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// snippetHarness surrounds README's Go snippets with what they leave out:
// the imports, the types and variables they use, and the function a
// statement snippet runs in. A snippet that starts with func is top-level.
const snippetHarness = `package main

import (
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/schema"
	"github.com/ferryhq/ferry/outbox"
)

var (
	_ = json.Marshal
	_ = signal.NotifyContext
	_ = syscall.SIGTERM
	_ = os.Exit
	_ = workercli.Main
	_ *inbox.Message
	_ pgx.Tx
	_ outbox.Event
)

// Order is the payload the worker snippet decodes.
type Order struct {
	SKU string
	Qty int
}

var stockMigrations schema.Set
`

var goBlockRE = regexp.MustCompile("(?s)```go\n(.*?)```")

// README's Go snippets compile against today's API: go vet type-checks
// them inside snippetHarness.
func TestReadmeSnippetsCompile(t *testing.T) {
	root := ferrytest.RepoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlockRE.FindAllStringSubmatch(string(b), -1)
	if len(blocks) < 2 {
		t.Fatalf("README has %d Go snippets, want at least 2", len(blocks))
	}
	var src strings.Builder
	src.WriteString(snippetHarness)
	for i, m := range blocks {
		code := m[1]
		if strings.HasPrefix(code, "func ") {
			src.WriteString("\n" + code)
			continue
		}
		src.WriteString("\nfunc snippet" + string(rune('A'+i)) +
			"(ctx context.Context, pool *pgxpool.Pool, id string, total int, payload []byte) error {\n" +
			code + "\treturn err\n}\n")
	}
	// Inside the module, so that its requirements resolve; testdata keeps
	// it out of ./... for everyone else.
	base := filepath.Join(root, "internal", "readme", "testdata")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(base, "snippets")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir); os.Remove(base) }) // base only when empty
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "vet", "./"+filepath.Base(dir))
	cmd.Dir = base
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("README's Go snippets do not compile: %v\n%s\n--- the program:\n%s", err, out, src.String())
	}
}
