// Package scaffold writes a new worker from the reserva example's pattern:
// a handler package with its test and migration, and a main that hosts it
// through Ferry's worker command line (`worker scaffold NAME --dir PATH`).
package scaffold

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"
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

var validName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,40}$`)

type data struct {
	Name, Package, EventType, AggregateType, ImportPath string
}

// Generate writes the worker. It refuses to overwrite a file.
func Generate(o Options) (*Result, error) {
	if !validName.MatchString(o.Name) || strings.HasSuffix(o.Name, "-") {
		return nil, fmt.Errorf("scaffold: NAME %q: use lower-case letters, digits and dashes, starting with a letter", o.Name)
	}
	if o.Dir == "" {
		return nil, errors.New("scaffold: --dir is required")
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	d := data{
		Name:          o.Name,
		Package:       strings.ReplaceAll(o.Name, "-", ""),
		EventType:     o.EventType,
		AggregateType: o.AggregateType,
	}
	if d.EventType == "" {
		d.EventType = camel(o.Name) + "Requested"
	}
	if d.AggregateType == "" {
		d.AggregateType = "order"
	}
	res := &Result{}
	modDir, modPath, err := findModule(dir)
	if err != nil {
		return nil, err
	}
	var gomod []byte
	if modDir == "" {
		res.NewModule = true
		modDir, modPath = dir, d.Package
		gomod = fmt.Appendf(nil, "module %s\n\ngo 1.26\n\nrequire github.com/ferryhq/ferry v0.0.0\n", modPath)
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
	d.ImportPath = modPath
	if rel != "." {
		d.ImportPath = modPath + "/" + filepath.ToSlash(rel)
	}
	res.ImportPath = d.ImportPath

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
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return nil, fmt.Errorf("scaffold: %s exists; choose an empty --dir", filepath.Join(dir, name))
		}
	}
	for name, body := range out {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, body, 0o644); err != nil {
			return nil, err
		}
		res.Files = append(res.Files, path)
	}
	return res, nil
}

// findModule returns the directory and module path of the go.mod above dir.
func findModule(dir string) (string, string, error) {
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
