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
	for _, test := range []string{"TestHandleRecordsTheEffect", "TestLocksNameTheSharedRow", "TestHandleRefusesMalformedPayloadForGood"} {
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

// Workers whose names are standard package names, or names the generated
// files use for their own variables and imports, build and pass go vet: in
// a new module (whose path must not be taken for the standard library's)
// and inside it. Names that cannot be a Go package (keywords, main) are
// refused, naming NAME.
func TestScaffoldNamesThatClashWithGoBuild(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "fmt")
	if _, err := scaffold.Generate(scaffold.Options{Name: "fmt", Dir: root, FerryReplace: ferrytest.RepoRoot(t)}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"os", "errors", "context", "testing", "inbox", "migrate", "pgx", "workercli",
		"db", "url", "pool", "schema", "cfg", "t", "b", "m", "string", "init", "worker", "handler"} {
		if _, err := scaffold.Generate(scaffold.Options{Name: name, Dir: filepath.Join(root, "workers", name)}); err != nil {
			t.Fatalf("NAME %s: %v", name, err)
		}
	}
	goCmd(t, root, "mod", "tidy")
	goCmd(t, root, "vet", "./...")
	goCmd(t, root, "build", "./...")

	for _, name := range []string{"func", "main", "type", "go-to", "import", "range"} {
		_, err := scaffold.Generate(scaffold.Options{Name: name, Dir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), "NAME") {
			t.Fatalf("NAME %s: %v, want a refusal naming NAME", name, err)
		}
	}
}

// --event-type and --aggregate-type reach the generated code only as
// escaped Go string literals: quotes, backslashes, newlines and verbs
// compile, vet cleanly and reach the handler unchanged (its generated test
// passes). What the relay could never publish is refused, naming the flag.
func TestScaffoldEscapesTheEventType(t *testing.T) {
	t.Parallel()
	ferrytest.AdminURL(t) // the generated test needs the stack: fail, don't skip
	dir := filepath.Join(t.TempDir(), "audit")
	eventType := "Order \"Placed\" \\ %w\n}\nfunc init() { panic(1) }\n// "
	if _, err := scaffold.Generate(scaffold.Options{Name: "audit", Dir: dir, EventType: eventType, FerryReplace: ferrytest.RepoRoot(t)}); err != nil {
		t.Fatal(err)
	}
	goCmd(t, dir, "mod", "tidy")
	goCmd(t, dir, "vet", "./...")
	out := goCmd(t, dir, "test", "-count=1", "-v", "./...")
	for _, test := range []string{"TestHandleRecordsTheEffect", "TestLocksNameTheSharedRow", "TestHandleRefusesMalformedPayloadForGood"} {
		if !strings.Contains(out, "--- PASS: "+test) {
			t.Fatalf("%s did not pass:\n%s", test, out)
		}
	}
	for _, c := range []struct{ eventType, aggregateType, flag string }{
		{"Bad\x00Type", "", "--event-type"},
		{"Bad\xffType", "", "--event-type"},
		{"", "order\"; panic(1) //", "--aggregate-type"},
		{"", "a/b", "--aggregate-type"},
		{"", strings.Repeat("a", 300), "--aggregate-type"},
	} {
		_, err := scaffold.Generate(scaffold.Options{Name: "audit", Dir: t.TempDir(), EventType: c.eventType, AggregateType: c.aggregateType})
		if err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Fatalf("event type %q, aggregate type %q: %v, want a refusal naming %s", c.eventType, c.aggregateType, err, c.flag)
		}
	}
}

// A go.mod in --dir that is a symlink pointing nowhere is refused, not
// written through: the scaffold writes nothing outside --dir.
func TestScaffoldDoesNotWriteThroughASymlink(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	dir := filepath.Join(base, "work")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(base, "elsewhere", "go.mod")
	if err := os.Mkdir(filepath.Dir(outside), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "go.mod")); err != nil {
		t.Fatal(err)
	}
	_, err := scaffold.Generate(scaffold.Options{Name: "billing", Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "--dir") || !strings.Contains(err.Error(), "go.mod") {
		t.Fatalf("Generate into a dir with a dangling go.mod symlink: %v, want a refusal naming --dir and go.mod", err)
	}
	if _, err := os.Lstat(outside); err == nil {
		t.Fatalf("the scaffold wrote %s, outside --dir, through the symlink", outside)
	}
	// A symlinked subdirectory would carry files out of --dir too.
	dir2 := filepath.Join(base, "work2")
	if err := os.MkdirAll(dir2, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir2, "go.mod"), []byte("module example.com/w\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(dir2, "migrations")); err != nil {
		t.Fatal(err)
	}
	_, err = scaffold.Generate(scaffold.Options{Name: "billing", Dir: dir2})
	if err == nil || !strings.Contains(err.Error(), "--dir") || !strings.Contains(err.Error(), "migrations") {
		t.Fatalf("Generate into a dir whose migrations/ is a symlink: %v, want a refusal naming --dir and migrations", err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(outside)); len(entries) != 0 {
		t.Fatalf("the scaffold wrote %v outside --dir, through a symlinked directory", entries)
	}
}
