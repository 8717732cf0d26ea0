package readme_test

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/internal/readme"
)

// The example binaries the docs show, built for their -h; relay and worker
// run in process (readme.Help), as the flag reference does.
var examples = map[string]string{
	"reserva-worker": "github.com/ferryhq/ferry/examples/reserva/cmd/reserva-worker",
	"reserva":        "github.com/ferryhq/ferry/examples/reserva/cmd/reserva",
}

// faultBuilds are the commands whose `run` the fault suite builds with the
// ferryfault tag, which adds the negative controls' flags.
var faultBuilds = map[string]string{
	"relay":          "github.com/ferryhq/ferry/cmd/relay",
	"reserva-worker": examples["reserva-worker"],
}

var exampleCommands = map[string][][]string{
	"reserva-worker": {{"run"}, {"status"}, {"prune"}, {"schema"}, {"dlq", "list"}, {"dlq", "redrive"}},
	"reserva":        {{"demo"}, {"api"}, {"migrate"}},
}

// A doc is one markdown file the test keeps true, by its slash path from
// the repository root.
type doc struct {
	path string
	text string
}

type fixture struct {
	root     string
	docs     []doc
	help     map[string]string // "relay run" -> its -h output
	commands map[string][][]string
	known    string // every help text, for flags mentioned in prose
}

var (
	once    sync.Once
	shared  *fixture
	onceErr string
)

// setup reads the docs and every command's help once for all the tests.
func setup(t *testing.T) *fixture {
	t.Helper()
	once.Do(func() { shared, onceErr = build(t) })
	if onceErr != "" {
		t.Fatal(onceErr)
	}
	return shared
}

func build(t *testing.T) (*fixture, string) {
	root := ferrytest.RepoRoot(t)
	f := &fixture{root: root, help: map[string]string{}, commands: map[string][][]string{}}
	paths := []string{"README.md", "CONTRIBUTING.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			paths = append(paths, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		return nil, err.Error()
	}
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return nil, err.Error()
		}
		f.docs = append(f.docs, doc{p, string(b)})
	}
	var all strings.Builder
	for bin, cmds := range readme.Commands {
		for _, words := range cmds {
			h, err := readme.Help(bin, words)
			if err != nil {
				return nil, err.Error()
			}
			all.WriteString(h)
			if bin == "worker" && len(words) > 0 && words[0] == "run" {
				continue // the run of your own binary, not of Ferry's worker
			}
			f.help[bin+" "+strings.Join(words, " ")] = h
			f.commands[bin] = append(f.commands[bin], words)
		}
	}
	dir, err := os.MkdirTemp("", "ferry-readme")
	if err != nil {
		return nil, err.Error()
	}
	defer os.RemoveAll(dir) // the help texts are all that is kept
	for name, pkg := range examples {
		bin := filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			return nil, fmt.Sprintf("build %s: %v\n%s", pkg, err, out)
		}
		for _, sub := range exampleCommands[name] {
			out, err := exec.Command(bin, append(sub, "-h")...).CombinedOutput()
			if err != nil {
				return nil, fmt.Sprintf("%s %s -h: %v\n%s", name, strings.Join(sub, " "), err, out)
			}
			f.help[name+" "+strings.Join(sub, " ")] = string(out)
			all.Write(out)
		}
		f.commands[name] = exampleCommands[name]
	}
	// The negative controls' flags exist only in the fault suite's builds
	// (the ferryfault tag); the docs may name them as such.
	for name, pkg := range faultBuilds {
		bin := filepath.Join(dir, "ferryfault-"+name)
		if out, err := exec.Command("go", "build", "-tags", "ferryfault", "-o", bin, pkg).CombinedOutput(); err != nil {
			return nil, fmt.Sprintf("build -tags ferryfault %s: %v\n%s", pkg, err, out)
		}
		out, err := exec.Command(bin, "run", "-h").CombinedOutput()
		if err != nil {
			return nil, fmt.Sprintf("ferryfault %s run -h: %v\n%s", name, err, out)
		}
		all.Write(out)
	}
	f.known = all.String()
	return f, ""
}

// The docs the test reads are all there: README, CONTRIBUTING and a docs
// tree, so that a walk that found nothing cannot pass.
func TestDocsAreRead(t *testing.T) {
	f := setup(t)
	if len(f.docs) < 15 {
		var names []string
		for _, d := range f.docs {
			names = append(names, d.path)
		}
		t.Fatalf("read only %d docs: %s", len(f.docs), strings.Join(names, ", "))
	}
}

// shellLines returns the command lines of a doc's sh code blocks, without
// comments.
func shellLines(text string) []string {
	var lines []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
		case strings.HasPrefix(line, "```"):
			in = false
		case in:
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			if line = strings.TrimSpace(line); line != "" {
				lines = append(lines, line)
			}
		}
	}
	return lines
}

// prose returns a doc without its fenced code blocks.
func prose(text string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			in = !in
			continue
		}
		if !in {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

var (
	flagRE   = regexp.MustCompile(`(?:^|[\s(` + "`" + `])(--[a-z][a-z0-9-]+)`)
	envRE    = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)
	makeRE   = regexp.MustCompile("`make ([a-z][a-z0-9-]*)")
	linkRE   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchorRE = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

func (f *fixture) makeHelp(t *testing.T) []byte {
	t.Helper()
	out, err := exec.Command("make", "-s", "-C", f.root, "help").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func hasTarget(makeHelp []byte, target string) bool {
	return regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(target) + `\s`).Match(makeHelp)
}

// Every command line of the docs' shell blocks names a make target, script,
// binary, subcommand and flags that exist.
func TestDocsCommandsExist(t *testing.T) {
	f := setup(t)
	makeHelp := f.makeHelp(t)
	stackHelp, _ := exec.Command(filepath.Join(f.root, "scripts", "stack"), "help").CombinedOutput()
	total := 0
	for _, d := range f.docs {
		lines := shellLines(d.text)
		total += len(lines)
		for _, line := range lines {
			for _, cmd := range strings.Split(line, "&&") {
				f.checkCommand(t, d.path, strings.TrimSpace(cmd), makeHelp, stackHelp)
			}
		}
	}
	if total < 40 {
		t.Fatalf("found only %d command lines in the docs", total)
	}
}

func (f *fixture) checkCommand(t *testing.T, file, cmd string, makeHelp, stackHelp []byte) {
	t.Helper()
	words := strings.Fields(cmd)
	for len(words) > 0 && envRE.MatchString(words[0]) {
		words = words[1:] // FERRY_STACK_DIR=... scripts/stack up
	}
	if len(words) == 0 {
		return
	}
	if len(words) > 2 && words[0] == "go" && words[1] == "run" {
		words = append([]string{filepath.Base(words[2])}, words[3:]...)
	}
	name := strings.TrimPrefix(words[0], "bin/")
	switch {
	case name == "make":
		for _, target := range words[1:] {
			if !strings.Contains(target, "=") && !hasTarget(makeHelp, target) {
				t.Errorf("%s runs `make %s`, which `make help` does not list", file, target)
			}
		}
	case name == "scripts/stack":
		if len(words) < 2 || !strings.Contains(string(stackHelp), "scripts/stack "+words[1]) {
			t.Errorf("%s runs `%s`, which scripts/stack's help does not list", file, cmd)
		}
	case strings.HasPrefix(name, "scripts/"):
		if st, err := os.Stat(filepath.Join(f.root, name)); err != nil || st.Mode()&0o111 == 0 {
			t.Errorf("%s runs `%s`: %s is not an executable script", file, cmd, name)
		}
	case f.commands[name] != nil:
		help, sub := f.helpFor(name, words[1:])
		if help == "" {
			t.Errorf("%s runs `%s`: no such %s subcommand", file, cmd, name)
			return
		}
		for _, w := range words[1:] {
			if strings.HasPrefix(w, "--") {
				flag := strings.SplitN(w, "=", 2)[0]
				if !hasFlag(help, flag) {
					t.Errorf("%s runs `%s`: %s %s has no flag %s", file, cmd, name, sub, flag)
				}
			}
		}
	}
}

func hasFlag(help, flag string) bool {
	f := "-" + strings.TrimLeft(flag, "-")
	return strings.Contains(help, f+" ") || strings.Contains(help, f+"\n")
}

// helpFor finds the longest known subcommand that words start with.
func (f *fixture) helpFor(name string, words []string) (string, string) {
	best, bestSub, bestLen := "", "", -1
	for _, sub := range f.commands[name] {
		if len(sub) > 0 && len(words) >= len(sub) && strings.Join(words[:len(sub)], " ") == strings.Join(sub, " ") && len(sub) > bestLen {
			best, bestSub, bestLen = f.help[name+" "+strings.Join(sub, " ")], strings.Join(sub, " "), len(sub)
		}
	}
	return best, bestSub
}

// otherFlags are the flags the docs show of other tools, with the tool.
var otherFlags = map[string]string{
	"--oneline": "git log",
	"--endpos":  "pg_recvlogical", // in docs/benchmarks.md, written by make bench
}

// Every --flag the docs mention anywhere (tables, prose) is a flag of one
// of Ferry's commands, or one of otherFlags.
func TestDocsFlagsExist(t *testing.T) {
	f := setup(t)
	for _, d := range f.docs {
		for _, m := range flagRE.FindAllStringSubmatch(d.text, -1) {
			if !hasFlag(f.known, m[1]) && otherFlags[m[1]] == "" {
				t.Errorf("%s mentions %s, which no relay, worker or reserva command has", d.path, m[1])
			}
		}
	}
}

// Every `make target` the docs' prose names is listed by `make help`.
func TestDocsMakeTargetsExist(t *testing.T) {
	f := setup(t)
	makeHelp := f.makeHelp(t)
	for _, d := range f.docs {
		for _, m := range makeRE.FindAllStringSubmatch(prose(d.text), -1) {
			if !hasTarget(makeHelp, m[1]) {
				t.Errorf("%s names `make %s`, which `make help` does not list", d.path, m[1])
			}
		}
	}
}

// links returns a doc's relative link targets outside code, as written.
func links(text string) []string {
	var out []string
	for _, m := range linkRE.FindAllStringSubmatch(prose(text), -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		out = append(out, target)
	}
	return out
}

// anchors returns the GitHub anchors of a markdown file's headings.
func anchors(text string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, line := range strings.Split(prose(text), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := strings.ReplaceAll(anchorRE.ReplaceAllString(strings.ToLower(h), ""), " ", "-")
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// Every relative link of README, CONTRIBUTING and docs/ points at a file
// that exists, and at a heading of it when it names one.
func TestDocsLinksResolve(t *testing.T) {
	f := setup(t)
	byPath := map[string]string{}
	for _, d := range f.docs {
		byPath[d.path] = d.text
	}
	n := 0
	for _, d := range f.docs {
		for _, target := range links(d.text) {
			n++
			file, anchor, _ := strings.Cut(target, "#")
			resolved := d.path
			if file != "" {
				resolved = path.Clean(path.Join(path.Dir(d.path), file))
			}
			if strings.HasPrefix(resolved, "../") {
				t.Errorf("%s links to %s, outside the repository", d.path, target)
				continue
			}
			if _, err := os.Stat(filepath.Join(f.root, filepath.FromSlash(resolved))); err != nil {
				t.Errorf("%s links to %s: %s does not exist", d.path, target, resolved)
				continue
			}
			if anchor == "" {
				continue
			}
			text, ok := byPath[resolved]
			if !ok {
				t.Errorf("%s links to %s: an anchor into a file the test does not read", d.path, target)
				continue
			}
			if !anchors(text)[anchor] {
				t.Errorf("%s links to %s: %s has no heading #%s", d.path, target, resolved, anchor)
			}
		}
	}
	if n < 50 {
		t.Fatalf("found only %d relative links in the docs", n)
	}
}

// Every page of docs/ can be reached from docs/README.md by following
// links.
func TestDocsPagesReachable(t *testing.T) {
	f := setup(t)
	byPath := map[string]string{}
	for _, d := range f.docs {
		byPath[d.path] = d.text
	}
	const index = "docs/README.md"
	if _, ok := byPath[index]; !ok {
		t.Fatalf("%s is missing", index)
	}
	reached := map[string]bool{index: true}
	queue := []string{index}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, target := range links(byPath[p]) {
			file, _, _ := strings.Cut(target, "#")
			if file == "" {
				continue
			}
			next := path.Clean(path.Join(path.Dir(p), file))
			if _, ok := byPath[next]; ok && !reached[next] && strings.HasPrefix(next, "docs/") {
				reached[next] = true
				queue = append(queue, next)
			}
		}
	}
	var missing []string
	for p := range byPath {
		if strings.HasPrefix(p, "docs/") && !reached[p] {
			missing = append(missing, p)
		}
	}
	sort.Strings(missing)
	for _, p := range missing {
		t.Errorf("%s is not reachable from %s", p, index)
	}
}
