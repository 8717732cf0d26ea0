package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// request is one `relay migration request` the demo ran, as it answered.
type request struct {
	phase    string
	slices   int
	accepted bool
	reason   string
}

func (r request) String() string {
	if r.slices != 0 {
		return fmt.Sprintf("%s %d", r.phase, r.slices)
	}
	return r.phase
}

// command runs one of the demo's binaries with the demo's database and
// cluster A, and returns its output (stdout, then stderr) and its exit
// error.
func (m *migrationDemo) command(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, m.bins[bin], args...)
	cmd.Env = append(os.Environ(), m.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String() + stderr.String(), err
}

// show prints a command line as the operator would type it.
func (m *migrationDemo) show(bin string, args ...string) {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = a
		if strings.ContainsAny(a, "{} *") {
			quoted[i] = "'" + a + "'"
		}
	}
	m.say("   $ %s %s", bin, strings.Join(quoted, " "))
}

// showOutput prints a command's output, indented, without the line naming
// the database, which every migration command prints first.
func (m *migrationDemo) showOutput(out string) {
	for line := range strings.Lines(out) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "database "+migrationDatabase+" on ") || strings.HasPrefix(line, "relay migration: request ") {
			continue // the second: a rejection's exit message, which repeats its reason
		}
		m.say("     %s", line)
	}
}

// requestArgs are the arguments of `relay migration request`.
func (m *migrationDemo) requestArgs(phase string, slices int) []string {
	args := []string{"migration", "request", m.plan, phase}
	if slices != 0 {
		args = append(args, "--slices", strconv.Itoa(slices))
	}
	return args
}

var (
	acceptedLine = regexp.MustCompile(`(?m)^accepted, epoch \d+: (.*)$`)
	rejectedLine = regexp.MustCompile(`(?m)^rejected \(epoch \d+ unchanged\): (.*)$`)
)

// decision reads the answer of `relay migration request` from its output
// and exit code: accepted (exit 0) or rejected (exit 1), and the reason;
// ok is false for anything else (the command did not decide).
func decision(out string, exitCode int) (accepted bool, reason string, ok bool) {
	switch {
	case exitCode == 0 && acceptedLine.MatchString(out):
		return true, acceptedLine.FindStringSubmatch(out)[1], true
	case exitCode == 1 && rejectedLine.MatchString(out):
		return false, rejectedLine.FindStringSubmatch(out)[1], true
	}
	return false, "", false
}

// producersHeading begins the section of `relay migration status` that
// lists the producers of a RabbitMQ old channel.
const producersHeading = "producers on the old channel"

// producersSection is that section of the output of `relay migration
// status`, to its end; "" when it has none.
func producersSection(out string) string {
	i := strings.Index(out, "\n"+producersHeading)
	if i < 0 {
		return ""
	}
	return out[i+1:]
}

// ask runs `relay migration request` once and records its answer. The
// error is for a command that did not decide (it could not run, or its
// output is not a decision), never for a rejection.
func (m *migrationDemo) ask(ctx context.Context, phase string, slices int) (request, string, error) {
	out, err := m.command(ctx, "relay", m.requestArgs(phase, slices)...)
	r := request{phase: phase, slices: slices}
	code := 0
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		return r, out, fmt.Errorf("relay migration request %s %s: %w", m.plan, r, err)
	}
	var ok bool
	if r.accepted, r.reason, ok = decision(out, code); !ok {
		return r, out, fmt.Errorf("relay migration request %s %s: exit code %d, no decision in its output: %s", m.plan, r, code, strings.TrimSpace(out))
	}
	m.requests = append(m.requests, r)
	return r, out, nil
}

// mustRequest asks once and wants an acceptance.
func (m *migrationDemo) mustRequest(ctx context.Context, phase string, slices int) error {
	m.show("relay", m.requestArgs(phase, slices)...)
	r, out, err := m.ask(ctx, phase, slices)
	if err != nil {
		return err
	}
	m.showOutput(out)
	if !r.accepted {
		return fmt.Errorf("%s rejected: %s", r, r.reason)
	}
	m.phase = r.String()
	return nil
}

// requestUntil asks every second until the request is accepted, printing
// each kind of rejection once. It keeps asking while the rejection's
// figures move (groups catching up, reports changing), and gives up when
// they stood still for the gate timeout, or after the longest gate wait
// in all, with a diagnosis: `relay migration status` as it stands.
func (m *migrationDemo) requestUntil(ctx context.Context, phase string, slices int) error {
	m.show("relay", m.requestArgs(phase, slices)...)
	m.say("     (asked every second until accepted: for as long as the reason's figures move, up to %s, or %s without a change; each reason shown once)",
		m.mo.gateMax, m.mo.gateTimeout)
	patience := gatePatience{stillFor: m.mo.gateTimeout, most: m.mo.gateMax, start: time.Now()}
	seen := map[string]bool{}
	rejected := 0
	for {
		r, out, err := m.ask(ctx, phase, slices)
		if err != nil {
			return err
		}
		if r.accepted {
			m.say("   %s accepted after %d rejections:", m.elapsed(), rejected)
			m.showOutput(out)
			m.phase = r.String()
			return nil
		}
		rejected++
		if key := reasonKind(r.reason); !seen[key] {
			seen[key] = true
			m.say("   %s rejected: %s", m.elapsed(), r.reason)
		}
		if why := patience.giveUp(r.reason, time.Now()); why != "" {
			m.diagnose(ctx)
			return fmt.Errorf("%s %s (%d requests): %s", r, why, rejected, r.reason)
		}
		if err := m.wait(ctx, time.Second); err != nil {
			return err
		}
	}
}

// gatePatience decides when a demo stops asking a closed gate: not while
// the rejection's figures move (the gate's inputs are changing), but once
// the same reason stood still for stillFor, or after most in all.
type gatePatience struct {
	stillFor, most time.Duration
	start          time.Time
	last           string    // the newest reason
	since          time.Time // when it was first given
}

// giveUp records the reason of a rejection at now and says why to stop
// asking, "" to go on.
func (g *gatePatience) giveUp(reason string, now time.Time) string {
	if reason != g.last || g.since.IsZero() {
		g.last, g.since = reason, now
	}
	switch {
	case now.Sub(g.since) >= g.stillFor:
		return fmt.Sprintf("unchanged for %s", g.stillFor)
	case now.Sub(g.start) >= g.most:
		return fmt.Sprintf("still rejected after %s", g.most)
	}
	return ""
}

// diagnose prints `relay migration status` of the plan, as an operator
// would look at a gate that does not open.
func (m *migrationDemo) diagnose(ctx context.Context) {
	args := []string{"migration", "status", m.plan}
	m.say("   the gate gives up; what it sees:")
	m.show("relay", args...)
	out, err := m.command(ctx, "relay", args...)
	m.showOutput(out)
	if err != nil {
		m.say("     (%v)", err)
	}
}

var digits = regexp.MustCompile(`[0-9]+(\.[0-9]+)?`)

// reasonKind is a rejection's reason without its numbers (times, counts,
// epochs), so that the same reason shows once however its figures move.
func reasonKind(reason string) string { return digits.ReplaceAllString(reason, "#") }
