// Package scaffold writes a new worker from the reserva example's pattern:
// a handler package with its test and migration, and a main that hosts it
// through Ferry's worker command line (`worker scaffold NAME --dir PATH`).
package scaffold

import (
	"bytes"
	"cmp"
	"embed"
	"errors"
	"fmt"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/template"
	"unicode/utf8"

	"github.com/ferryhq/ferry/inbox"
)

//go:embed templates/*.tmpl
var templates embed.FS

// Options describe the worker to write.
type Options struct {
	// Name of the worker: lower-case letters, digits and dashes
	// ("shipping", "stock-audit"). It names the consumer, the package
	// (without dashes) and cmd/<name>-worker. Required.
	Name string
	// Dir receives the files; it must not hold them already. Required.
	Dir string
	// EventType is the event the handler applies. Defaults to
	// "<Name>Requested" in CamelCase.
	EventType string
	// AggregateType is the outbox aggregate type whose topic the worker
	// reads. Defaults to "order".
	AggregateType string
	// FerryReplace, when Dir is in no Go module yet, makes the new go.mod
	// replace github.com/ferryhq/ferry with this local checkout.
	FerryReplace string
}

// Result lists what Generate wrote.
type Result struct {
	Files      []string
	ImportPath string
	NewModule  bool // a go.mod was written
}

// OptionError is an option Generate refuses: NAME, --event-type or
// --aggregate-type. The command line answers it as a usage error.
type OptionError struct {
	Option string // as the command line spells it
	Value  string
	Err    error
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("scaffold: %s %q: %v", e.Option, e.Value, e.Err)
}

func (e *OptionError) Unwrap() error { return e.Err }

var validName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,40}$`)

// data fills the templates. Name and Package are checked to be plain words;
// everything else reaches Go source only as a quoted literal (the Quoted
// fields), never pasted in raw.
type data struct {
	Name, Package                              string
	EventTypeQuoted, TopicQuoted, ImportQuoted string
}

// Generate writes the worker. It refuses to overwrite a file or to write
// through a symbolic link.
func Generate(o Options) (*Result, error) {
	if !validName.MatchString(o.Name) || strings.HasSuffix(o.Name, "-") {
		return nil, &OptionError{"NAME", o.Name, errors.New("use lower-case letters, digits and dashes, starting with a letter")}
	}
	pkg := strings.ReplaceAll(o.Name, "-", "")
	if err := checkPackageName(pkg); err != nil {
		return nil, &OptionError{"NAME", o.Name, fmt.Errorf("%w; choose another name", err)}
	}
	if o.Dir == "" {
		return nil, errors.New("scaffold: --dir is required")
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	eventType := cmp.Or(o.EventType, camel(o.Name)+"Requested")
	if err := checkEventType(eventType); err != nil {
		return nil, &OptionError{"--event-type", eventType, err}
	}
	topic := "outbox.event." + cmp.Or(o.AggregateType, "order")
	if err := checkTopic(topic); err != nil {
		return nil, &OptionError{"--aggregate-type", o.AggregateType, err}
	}
	d := data{
		Name:            o.Name,
		Package:         pkg,
		EventTypeQuoted: strconv.Quote(eventType),
		TopicQuoted:     strconv.Quote(topic),
	}
	res := &Result{}
	modDir, modPath, err := findModule(dir)
	if err != nil {
		return nil, err
	}
	var gomod []byte
	if modDir == "" {
		res.NewModule = true
		// Go reserves paths whose first element has no dot for its standard
		// library: a module named "fmt" or "errors" would clash with it.
		modDir, modPath = dir, "example.com/"+d.Package
		gomod = fmt.Appendf(nil, "// Put your repository's path here: example.com keeps it clear of the\n// standard library's paths.\nmodule %s\n\ngo 1.26\n\nrequire github.com/ferryhq/ferry v0.0.0\n", modPath)
		if o.FerryReplace != "" {
			abs, err := filepath.Abs(o.FerryReplace)
			if err != nil {
				return nil, err
			}
			gomod = fmt.Appendf(gomod, "\nreplace github.com/ferryhq/ferry => %s\n", abs)
		}
	}
	rel, err := filepath.Rel(modDir, dir)
	if err != nil {
		return nil, err
	}
	res.ImportPath = modPath
	if rel != "." {
		res.ImportPath = modPath + "/" + filepath.ToSlash(rel)
	}
	d.ImportQuoted = strconv.Quote(res.ImportPath)

	files := map[string]string{
		d.Package + ".go":      "handler.go.tmpl",
		d.Package + "_test.go": "handler_test.go.tmpl",
		filepath.Join("migrations", "00001_"+d.Package+".sql"): "migration.sql.tmpl",
		filepath.Join("cmd", o.Name+"-worker", "main.go"):      "main.go.tmpl",
	}
	out := map[string][]byte{}
	for name, tmpl := range files {
		t, err := template.ParseFS(templates, "templates/"+tmpl)
		if err != nil {
			return nil, err
		}
		var b bytes.Buffer
		if err := t.Execute(&b, d); err != nil {
			return nil, err
		}
		out[name] = b.Bytes()
	}
	if gomod != nil {
		out["go.mod"] = gomod
	}
	for name := range out {
		if err := checkFree(dir, name); err != nil {
			return nil, err
		}
	}
	for name, body := range out {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		if err := writeNew(path, body); err != nil {
			return nil, fmt.Errorf("scaffold: --dir %s: %w", dir, err)
		}
		res.Files = append(res.Files, path)
	}
	return res, nil
}

// checkFree refuses to write name (a path inside dir) when it or a directory
// on the way to it exists as a symbolic link: a dangling one would be
// written through, and a file would land outside --dir. Lstat, not Stat,
// since Stat follows the link and a dangling link looks absent.
func checkFree(dir, name string) error {
	path := dir
	for _, part := range strings.Split(name, string(filepath.Separator)) {
		path = filepath.Join(path, part)
		fi, err := os.Lstat(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return fmt.Errorf("scaffold: --dir %s: %w", dir, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("scaffold: --dir %s: %s is a symbolic link; the scaffold writes only inside --dir, remove it or choose another --dir", dir, name)
		case path == filepath.Join(dir, name):
			return fmt.Errorf("scaffold: --dir %s: %s exists; choose an empty --dir", dir, name)
		}
	}
	return nil
}

// writeNew creates path, failing if anything, even a dangling symbolic link,
// is already there (O_EXCL does not follow links): nothing checked above can
// be swapped for a link before the write.
func writeNew(path string, body []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// checkPackageName refuses what cannot name an importable Go package. Other
// words (fmt, os, t) are fine: the generated files import the package under
// the fixed name worker, so it shadows nothing.
func checkPackageName(pkg string) error {
	switch {
	case token.IsKeyword(pkg):
		return fmt.Errorf("its package name %q is a Go keyword", pkg)
	case pkg == "main":
		return errors.New(`its package name "main" is a program, which cannot be imported`)
	}
	return nil
}

// checkEventType refuses what the outbox writer refuses in an event type.
func checkEventType(s string) error {
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return errors.New("must be UTF-8 text without NUL bytes, as the outbox requires")
	}
	return nil
}

// checkTopic applies Kafka's topic name rules to the topic the worker reads,
// and keeps it out of the dead-letter topics, which the relay never writes.
func checkTopic(topic string) error {
	if len(topic) > 249 {
		return fmt.Errorf("the topic %s is longer than Kafka's 249 characters", topic)
	}
	for i := range len(topic) {
		c := topic[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return errors.New("use letters, digits, '.', '_' and '-': it names a Kafka topic")
		}
	}
	if strings.HasSuffix(topic, inbox.DeadLetterSuffixDefault) {
		return fmt.Errorf("the topic %s would be a dead-letter topic", topic)
	}
	return nil
}

// findModule returns the directory and module path of the go.mod above dir.
func findModule(dir string) (string, string, error) {
	// A go.mod in dir that is there but cannot be read (a dangling symbolic
	// link) is an error: looking further up would take another module's
	// path, or end in writing a new go.mod through the link.
	if _, err := os.Lstat(filepath.Join(dir, "go.mod")); err == nil {
		if _, err := os.ReadFile(filepath.Join(dir, "go.mod")); err != nil {
			return "", "", fmt.Errorf("scaffold: --dir %s: go.mod cannot be read: %w; remove it or choose another --dir", dir, err)
		}
	}
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil {
			path := modulePath(b)
			if path == "" {
				return "", "", fmt.Errorf("scaffold: %s has no module line", filepath.Join(d, "go.mod"))
			}
			return d, path, nil
		}
		if filepath.Dir(d) == d {
			return "", "", nil
		}
	}
}

// modulePath reads the module line of a go.mod.
func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module"); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

func camel(name string) string {
	var b strings.Builder
	for _, part := range strings.Split(name, "-") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}
