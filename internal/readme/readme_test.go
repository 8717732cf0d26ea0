package readme_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/ferryhq/ferry/internal/ferrytest"
)

// commands are the binaries README shows and the subcommands whose -h lists
// their flags.
var commands = map[string][][]string{
	"relay": {{"run"}, {"status"}, {"prune"}, {"recover"}, {"migrate"}, {"quarantine", "list"}, {"quarantine", "requeue"}, {"quarantine", "discard"},
		{"migration", "create"}, {"migration", "list"}, {"migration", "status"}, {"migration", "request"}, {"migration", "history"}, {"bridge"}},
	"worker":         {{"status"}, {"prune"}, {"migrate"}, {"dlq", "list"}, {"dlq", "redrive"}, {"scaffold"}, {"migration", "quarantine", "list"}, {"migration", "quarantine", "replay"}},
	"reserva-worker": {{"run"}, {"status"}, {"prune"}, {"migrate"}, {"dlq", "list"}, {"dlq", "redrive"}},
	"reserva":        {{"demo"}, {"api"}, {"migrate"}},
}

var pkgs = map[string]string{
	"relay":          "github.com/ferryhq/ferry/cmd/relay",
	"worker":         "github.com/ferryhq/ferry/cmd/worker",
	"reserva-worker": "github.com/ferryhq/ferry/examples/reserva/cmd/reserva-worker",
	"reserva":        "github.com/ferryhq/ferry/examples/reserva/cmd/reserva",
}

// faultBuilds are the commands whose `run` the fault suite builds with the
// ferryfault tag, which adds the negative controls' flags.
var faultBuilds = map[string]string{
	"relay":          pkgs["relay"],
	"reserva-worker": pkgs["reserva-worker"],
}

type fixture struct {
	root   string
	readme string
	help   map[string]string // "relay run" -> its -h output
}

var (
	once    sync.Once
	shared  *fixture
	onceErr string
)

// setup builds the binaries and reads their help once for both tests.
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
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		return nil, err.Error()
	}
	f := &fixture{root: root, readme: string(b), help: map[string]string{}}
	dir, err := os.MkdirTemp("", "ferry-readme")
	if err != nil {
		return nil, err.Error()
	}
	defer os.RemoveAll(dir) // the help texts are all that is kept
	for name, pkg := range pkgs {
		bin := filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			return nil, fmt.Sprintf("build %s: %v\n%s", pkg, err, out)
		}
		for _, sub := range commands[name] {
			out, err := exec.Command(bin, append(sub, "-h")...).CombinedOutput()
			if err != nil {
				return nil, fmt.Sprintf("%s %s -h: %v\n%s", name, strings.Join(sub, " "), err, out)
			}
			f.help[name+" "+strings.Join(sub, " ")] = string(out)
		}
	}
	// The negative controls' flags exist only in the fault suite's
	// builds (the ferryfault tag); README may name them as such.
	for name, pkg := range faultBuilds {
		bin := filepath.Join(dir, "ferryfault-"+name)
		if out, err := exec.Command("go", "build", "-tags", "ferryfault", "-o", bin, pkg).CombinedOutput(); err != nil {
			return nil, fmt.Sprintf("build -tags ferryfault %s: %v\n%s", pkg, err, out)
		}
		out, err := exec.Command(bin, "run", "-h").CombinedOutput()
		if err != nil {
			return nil, fmt.Sprintf("ferryfault %s run -h: %v\n%s", name, err, out)
		}
		f.help["ferryfault "+name+" run"] = string(out)
	}
	return f, ""
}

// shellLines returns the command lines of README's sh code blocks, without
// comments.
func (f *fixture) shellLines() []string {
	var lines []string
	in := false
	for _, line := range strings.Split(f.readme, "\n") {
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

var flagRE = regexp.MustCompile(`(?:^|[\s(` + "`" + `])(--[a-z][a-z0-9-]+)`)

// Every command line of README's shell blocks names a make target, binary,
// subcommand and flags that exist.
func TestReadmeCommandsExist(t *testing.T) {
	f := setup(t)
	makeHelp, err := exec.Command("make", "-s", "-C", f.root, "help").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	stackHelp, _ := exec.Command(filepath.Join(f.root, "scripts", "stack"), "help").CombinedOutput()
	lines := f.shellLines()
	if len(lines) < 10 {
		t.Fatalf("found only %d command lines in README", len(lines))
	}
	for _, line := range lines {
		for _, cmd := range strings.Split(line, "&&") {
			words := strings.Fields(strings.TrimSpace(cmd))
			if len(words) == 0 {
				continue
			}
			if len(words) > 2 && words[0] == "go" && words[1] == "run" {
				words = append([]string{filepath.Base(words[2])}, words[3:]...)
			}
			name := strings.TrimPrefix(words[0], "bin/")
			switch {
			case name == "make":
				for _, target := range words[1:] {
					if strings.Contains(target, "=") {
						continue
					}
					if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(target) + `\s`).Match(makeHelp) {
						t.Errorf("README runs `make %s`, which `make help` does not list", target)
					}
				}
			case name == "scripts/stack":
				if !strings.Contains(string(stackHelp), words[1]) {
					t.Errorf("README runs `scripts/stack %s`, which its help does not list", words[1])
				}
			case pkgs[name] != "":
				help, sub := f.helpFor(name, words[1:])
				if help == "" {
					t.Errorf("README runs `%s`: no such %s subcommand", cmd, name)
					continue
				}
				for _, w := range words[1:] {
					if strings.HasPrefix(w, "--") {
						flag := strings.SplitN(w, "=", 2)[0]
						if !strings.Contains(help, "-"+strings.TrimLeft(flag, "-")+" ") && !strings.Contains(help, "-"+strings.TrimLeft(flag, "-")+"\n") {
							t.Errorf("README runs `%s`: %s %s has no flag %s", strings.TrimSpace(cmd), name, sub, flag)
						}
					}
				}
			}
		}
	}
}

// helpFor finds the longest known subcommand that words start with.
func (f *fixture) helpFor(name string, words []string) (string, string) {
	best, bestSub := "", ""
	for _, sub := range commands[name] {
		if len(words) >= len(sub) && strings.Join(words[:len(sub)], " ") == strings.Join(sub, " ") && len(sub) > len(strings.Fields(bestSub)) {
			best, bestSub = f.help[name+" "+strings.Join(sub, " ")], strings.Join(sub, " ")
		}
	}
	return best, bestSub
}

// Every --flag README mentions anywhere (tables, prose) is a flag of one of
// Ferry's commands, or of make's and go's own.
func TestReadmeFlagsExist(t *testing.T) {
	f := setup(t)
	var all strings.Builder
	for _, h := range f.help {
		all.WriteString(h)
	}
	known := all.String()
	for _, m := range flagRE.FindAllStringSubmatch(f.readme, -1) {
		flag := strings.TrimLeft(m[1], "-")
		if !strings.Contains(known, "-"+flag+" ") && !strings.Contains(known, "-"+flag+"\n") {
			t.Errorf("README mentions --%s, which no relay, worker or reserva command has", flag)
		}
	}
}
