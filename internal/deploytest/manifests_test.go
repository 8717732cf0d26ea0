package deploytest_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ferryhq/ferry/cmd/relay/relaycli"
	"github.com/ferryhq/ferry/cmd/worker/workercli"
	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/cli"
	"github.com/ferryhq/ferry/internal/ferrytest"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/schema"
)

// binary is a command deploy/ runs: its command line, the default of its
// --http-addr, and how long its `run` may take to stop on SIGTERM.
type binary struct {
	main     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
	httpAddr string
	stopping time.Duration
}

var binaries = map[string]binary{
	"relay": {relaycli.Main, relaycli.HTTPAddrDefault, relay.ShutdownTimeoutDefault},
	"reserva-worker": {func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
		return workercli.Main(ctx, args, stdout, stderr, &workercli.App{Name: "reserva-worker", Register: reserva.Register,
			Migrations: []schema.Set{reserva.Migrations}})
	}, workercli.HTTPAddrDefault, inbox.DrainTimeoutDefault},
}

// secrets are the variables that must come from a Secret or an
// EnvironmentFile, never from a manifest's or unit's own text.
var secrets = []string{"FERRY_DATABASE_URL", cli.SASLPasswordEnv}

// otherEnv are the variables besides Ferry's that a manifest may set.
var otherEnv = []string{"GOMEMLIMIT", "GOMAXPROCS"}

// command is one invocation of a binary in deploy/: a container or an
// ExecStart line.
type command struct {
	where   string
	argv    []string          // the binary's path, then its arguments
	env     map[string]string // variable -> value ("" when it comes from a secret)
	secrets map[string]bool   // the variables that come from a Secret or an EnvironmentFile
}

// checked is what check learnt about a command.
type checked struct {
	bin      string
	sub      string // "run", "migrate", ...
	httpPort int
}

// check fails the test for every binary, subcommand, flag or variable of c
// that does not exist, and for a secret not taken from a secret store.
func (c command) check(t *testing.T) (checked, bool) {
	t.Helper()
	if len(c.argv) == 0 {
		t.Errorf("%s: no command", c.where)
		return checked{}, false
	}
	name := filepath.Base(c.argv[0])
	bin, ok := binaries[name]
	if !ok {
		t.Errorf("%s: runs %s, which is none of %v", c.where, c.argv[0], slices.Sorted(maps.Keys(binaries)))
		return checked{}, false
	}
	var sub []string
	for _, a := range c.argv[1:] {
		if strings.HasPrefix(a, "-") {
			break
		}
		sub = append(sub, a)
	}
	help, err := helpOf(bin, sub)
	if err != nil {
		t.Errorf("%s: %s %s: %v", c.where, name, strings.Join(sub, " "), err)
		return checked{}, false
	}
	ck := checked{bin: name, sub: strings.Join(sub, " ")}
	httpAddr := bin.httpAddr
	if v, ok := c.env["FERRY_HTTP_ADDR"]; ok {
		httpAddr = v
	}
	args := c.argv[1+len(sub):]
	for i, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		flag, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.Contains(help, "  -"+flag+" ") && !strings.Contains(help, "  -"+flag+"\n") {
			t.Errorf("%s: %s %s has no flag --%s", c.where, name, ck.sub, flag)
		}
		if slices.Contains(secrets, cli.EnvName(flag)) {
			t.Errorf("%s: --%s on the command line shows a secret to ps; use %s from a secret", c.where, flag, cli.EnvName(flag))
		}
		if flag == "http-addr" {
			switch {
			case hasValue:
				httpAddr = value
			case i+1 < len(args):
				httpAddr = args[i+1]
			}
		}
	}
	for _, env := range slices.Sorted(maps.Keys(c.env)) {
		switch {
		case slices.Contains(otherEnv, env):
		case !strings.Contains(help, "(env "+env+")") && !(env == cli.SASLPasswordEnv && strings.Contains(help, env)):
			t.Errorf("%s: %s %s reads no variable %s", c.where, name, ck.sub, env)
		}
		if slices.Contains(secrets, env) && !c.secrets[env] {
			t.Errorf("%s: %s is written out; take it from a secret", c.where, env)
		}
	}
	if _, port, err := net.SplitHostPort(httpAddr); err == nil {
		ck.httpPort, _ = strconv.Atoi(port)
	}
	return ck, true
}

// helpOf returns the -h text of a binary's subcommand.
func helpOf(bin binary, sub []string) (string, error) {
	var out bytes.Buffer
	if code := bin.main(context.Background(), append(slices.Clone(sub), "-h"), &out, &out); code != 0 {
		return "", fmt.Errorf("no such subcommand (-h exits %d): %s", code, out.String())
	}
	return out.String(), nil
}

// k8sObject holds what the test reads of a Kubernetes object.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Replicas       *int `yaml:"replicas"`
		MinAvailable   any  `yaml:"minAvailable"`
		MaxUnavailable any  `yaml:"maxUnavailable"`
		Selector       struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
				Containers                    []k8sContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
	} `yaml:"resources"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

// port resolves a probe's port, a number or the name of a container port.
func (c *k8sContainer) port(p any) int {
	switch p := p.(type) {
	case int:
		return p
	case string:
		for _, cp := range c.Ports {
			if cp.Name == p {
				return cp.ContainerPort
			}
		}
	}
	return 0
}

func readManifests(t *testing.T) map[string][]k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(ferrytest.RepoRoot(t), "deploy", "kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	out := map[string][]k8sObject{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := "deploy/kubernetes/" + filepath.Base(f)
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("%s: a document without kind or metadata.name", name)
			}
			out[name] = append(out[name], o)
		}
	}
	return out
}

// The Kubernetes manifests run only commands, flags and variables that
// exist, take the secrets from Secrets, probe /healthz and /readyz on the
// port the process serves, run the relay as an active/standby pair, and
// give every Deployment a PodDisruptionBudget.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	var runs []string
	for file, objs := range readManifests(t) {
		for _, o := range objs {
			where := file + ": " + o.Kind + " " + o.Metadata.Name
			for _, c := range o.Spec.Template.Spec.Containers {
				cmd := command{where: where + ", container " + c.Name, argv: append(slices.Clone(c.Command), c.Args...),
					env: map[string]string{}, secrets: map[string]bool{}}
				for _, e := range c.Env {
					cmd.env[e.Name] = e.Value
					if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name != "" && e.ValueFrom.SecretKeyRef.Key != "" {
						cmd.secrets[e.Name] = true
					}
				}
				ck, ok := cmd.check(t)
				if !ok || ck.sub != "run" {
					continue
				}
				runs = append(runs, ck.bin)
				for _, p := range []struct {
					probe *k8sProbe
					path  string
				}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
					if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || c.port(p.probe.HTTPGet.Port) != ck.httpPort {
						t.Errorf("%s: want a probe of %s on port %d, the port %s serves", cmd.where, p.path, ck.httpPort, ck.bin)
					}
				}
				if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" {
					t.Errorf("%s: no cpu or memory request", cmd.where)
				}
				if port := o.Spec.Template.Metadata.Annotations["prometheus.io/port"]; port != strconv.Itoa(ck.httpPort) {
					t.Errorf("%s: prometheus.io/port %q, want %d", where, port, ck.httpPort)
				}
				grace := o.Spec.Template.Spec.TerminationGracePeriodSeconds
				if stop := binaries[ck.bin].stopping; grace == nil || time.Duration(*grace)*time.Second <= stop {
					t.Errorf("%s: terminationGracePeriodSeconds must exceed %s, how long %s may take to stop", where, stop, ck.bin)
				}
				if ck.bin == "relay" && (o.Spec.Replicas == nil || *o.Spec.Replicas != 2) {
					t.Errorf("%s: want 2 replicas, an active relay and its standby", where)
				}
				if !hasDisruptionBudget(objs, o.Spec.Template.Metadata.Labels) {
					t.Errorf("%s: no PodDisruptionBudget in %s selects its pods", where, file)
				}
			}
		}
	}
	slices.Sort(runs)
	if !slices.Contains(runs, "relay") || !slices.Contains(runs, "reserva-worker") {
		t.Errorf("the manifests run %v; want a relay and a worker", runs)
	}
}

// hasDisruptionBudget reports whether a PodDisruptionBudget among objs,
// with a minAvailable or maxUnavailable, selects pods labelled labels.
func hasDisruptionBudget(objs []k8sObject, labels map[string]string) bool {
	for _, o := range objs {
		sel := o.Spec.Selector.MatchLabels
		if o.Kind != "PodDisruptionBudget" || len(sel) == 0 || (o.Spec.MinAvailable == nil && o.Spec.MaxUnavailable == nil) {
			continue
		}
		matches := true
		for k, v := range sel {
			matches = matches && labels[k] == v
		}
		if matches {
			return true
		}
	}
	return false
}

// unit holds what the test reads of a systemd unit: its [Service] keys.
type unit map[string][]string

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u, section := unit{}, ""
	var line string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		part := strings.TrimSpace(sc.Text())
		if line == "" && (part == "" || strings.HasPrefix(part, "#") || strings.HasPrefix(part, ";")) {
			continue
		}
		if cont, ok := strings.CutSuffix(part, `\`); ok {
			line += cont + " "
			continue
		}
		line += part
		switch key, value, ok := strings.Cut(line, "="); {
		case strings.HasPrefix(line, "["):
			section = line
		case !ok:
			t.Errorf("%s: %q is neither a section nor a key=value line", path, line)
		case section == "[Service]":
			u[strings.TrimSpace(key)] = append(u[strings.TrimSpace(key)], strings.TrimSpace(value))
		}
		line = ""
	}
	return u
}

// readEnvFile reads the variables of an EnvironmentFile's example.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (each EnvironmentFile has its example beside the unit)", err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("%s: %q is not NAME=value", path, line)
		}
		env[k] = v
	}
	return env
}

// The systemd units run only commands, flags and variables that exist,
// take the secrets from an EnvironmentFile, and give the process the time
// it takes to stop.
func TestSystemdUnits(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(ferrytest.RepoRoot(t), "deploy", "systemd")
	files, err := filepath.Glob(filepath.Join(dir, "*.service"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no units in deploy/systemd: %v", err)
	}
	var runs []string
	for _, f := range files {
		u := readUnit(t, f)
		where := "deploy/systemd/" + filepath.Base(f)
		cmd := command{where: where, env: map[string]string{}, secrets: map[string]bool{}}
		for _, ef := range u["EnvironmentFile"] {
			for k, v := range readEnvFile(t, filepath.Join(dir, filepath.Base(strings.TrimPrefix(ef, "-"))+".example")) {
				cmd.env[k], cmd.secrets[k] = v, true
			}
		}
		for _, e := range u["Environment"] {
			for _, kv := range strings.Fields(e) {
				k, v, _ := strings.Cut(strings.Trim(kv, `"`), "=")
				cmd.env[k] = v
			}
		}
		if len(u["ExecStart"]) != 1 {
			t.Errorf("%s: want one ExecStart, have %d", where, len(u["ExecStart"]))
			continue
		}
		cmd.argv = strings.Fields(strings.TrimLeft(u["ExecStart"][0], "-@+!:"))
		ck, ok := cmd.check(t)
		if !ok {
			continue
		}
		if ck.sub != "run" {
			t.Errorf("%s: runs %s %s; a service runs `run`", where, ck.bin, ck.sub)
			continue
		}
		runs = append(runs, ck.bin)
		timeout := strings.Join(u["TimeoutStopSec"], "")
		if _, err := strconv.Atoi(timeout); err == nil {
			timeout += "s" // systemd's unit for a bare number
		}
		stop, err := time.ParseDuration(timeout)
		if err != nil || stop <= binaries[ck.bin].stopping {
			t.Errorf("%s: TimeoutStopSec %v must exceed %s, how long %s may take to stop", where, u["TimeoutStopSec"], binaries[ck.bin].stopping, ck.bin)
		}
	}
	slices.Sort(runs)
	if !slices.Contains(runs, "relay") || !slices.Contains(runs, "reserva-worker") {
		t.Errorf("the units run %v; want a relay and a worker", runs)
	}
}
