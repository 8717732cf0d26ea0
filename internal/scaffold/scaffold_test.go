package scaffold_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/scaffold"
)

func goCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// A scaffolded worker, in a module of its own that uses this checkout of
// Ferry, compiles, passes go vet, and its handler test passes against the
// real PostgreSQL.
func TestScaffoldedWorkerBuildsAndPasses(t *testing.T) {
	t.Parallel()
	ferrytest.AdminURL(t) // the generated test needs the stack: fail, don't skip
	dir := filepath.Join(t.TempDir(), "shipping")
	res, err := scaffold.Generate(scaffold.Options{Name: "stock-audit", Dir: dir, FerryReplace: ferrytest.RepoRoot(t)})
	if err != nil {
		t.Fatal(err)
	}
	if !res.NewModule || len(res.Files) != 5 {
		t.Fatalf("Generate = %+v, want a new module and 5 files", res)
	}
	goCmd(t, dir, "mod", "tidy")
	goCmd(t, dir, "vet", "./...")
	goCmd(t, dir, "build", "./...")
	out := goCmd(t, dir, "test", "-count=1", "-v", "./...")
	for _, test := range []string{"TestHandleRecordsTheEffect", "TestHandleRefusesMalformedPayloadForGood"} {
		if !strings.Contains(out, "--- PASS: "+test) {
			t.Fatalf("%s did not pass:\n%s", test, out)
		}
	}
	// The generated main is Ferry's worker CLI hosting the new handler.
	help := exec.Command("go", "run", "./cmd/stock-audit-worker", "help")
	help.Dir = dir
	b, _ := help.CombinedOutput()
	if !strings.Contains(string(b), "run") {
		t.Fatalf("stock-audit-worker help:\n%s", b)
	}
}

// Inside an existing module the import path follows the module, no go.mod
// is written, and nothing is overwritten.
func TestScaffoldInsideAModule(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module example.com/app\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "workers", "billing")
	res, err := scaffold.Generate(scaffold.Options{Name: "billing", Dir: dir, EventType: "InvoiceIssued", AggregateType: "invoice"})
	if err != nil {
		t.Fatal(err)
	}
	if res.NewModule || res.ImportPath != "example.com/app/workers/billing" {
		t.Fatalf("Generate = %+v, want import path example.com/app/workers/billing and no go.mod", res)
	}
	main, err := os.ReadFile(filepath.Join(dir, "cmd", "billing-worker", "main.go"))
	if err != nil || !strings.Contains(string(main), `"example.com/app/workers/billing"`) {
		t.Fatalf("main.go does not import the handler package: %v\n%s", err, main)
	}
	handler, _ := os.ReadFile(filepath.Join(dir, "billing.go"))
	if !strings.Contains(string(handler), `"outbox.event.invoice"`) || !strings.Contains(string(handler), `"InvoiceIssued"`) {
		t.Fatalf("handler does not use the event and aggregate types:\n%s", handler)
	}
	if _, err := scaffold.Generate(scaffold.Options{Name: "billing", Dir: dir}); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("second Generate into the same dir: %v, want a refusal to overwrite", err)
	}
	for _, bad := range []string{"", "Billing", "9lives", "a_b", "x-"} {
		if _, err := scaffold.Generate(scaffold.Options{Name: bad, Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "NAME") {
			t.Fatalf("name %q: %v, want an error naming NAME", bad, err)
		}
	}
}
