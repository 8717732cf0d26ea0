package route

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Side names a channel of a migration.
type Side string

// The two sides.
const (
	OldSide Side = "old"
	NewSide Side = "new"
)

// Role says what a copy of an event is to its consumers.
type Role string

// The roles.
const (
	// Authoritative: the copy consumers apply.
	Authoritative Role = "authoritative"
	// Shadow: the copy consumers only compare (arrival lateness, payload
	// digest) and never apply.
	Shadow Role = "shadow"
)

// Step is a plan's phase at one point of the commit order: an accepted
// change (ferry_migration_step), numbered by its epoch.
type Step struct {
	Plan   string
	Epoch  int
	Phase  Phase
	Slices int // slices moved to the new channel (CUTOVER)
}

// Copy is one record the relay writes for an event.
type Copy struct {
	Side Side
	Role Role
}

// Route returns the copies of an event of aggregateID under s, the
// authoritative one first:
//
//	OLD_ONLY     old (authoritative)
//	DUAL_WRITE   old (authoritative), new (shadow)
//	CUTOVER k    slice < k: new (authoritative), old (shadow); else as DUAL_WRITE
//	OLD_RETIRED  new (authoritative)
func (s Step) Route(aggregateID []byte) []Copy {
	switch s.Phase {
	case DualWrite:
		return []Copy{{OldSide, Authoritative}, {NewSide, Shadow}}
	case Cutover:
		if Slice(aggregateID) < s.Slices {
			return []Copy{{NewSide, Authoritative}, {OldSide, Shadow}}
		}
		return []Copy{{OldSide, Authoritative}, {NewSide, Shadow}}
	case OldRetired:
		return []Copy{{NewSide, Authoritative}}
	}
	return []Copy{{OldSide, Authoritative}}
}

// Authority returns the side whose copy of an event in slice is
// authoritative under s.
func (s Step) Authority(slice int) Side {
	switch s.Phase {
	case Cutover:
		if slice < s.Slices {
			return NewSide
		}
	case OldRetired:
		return NewSide
	}
	return OldSide
}

// History is a plan's accepted steps in epoch order, from its creation.
type History []Step

// Since returns the epoch from which the side authoritative for slice under
// the newest step has been so without a break: 0 when it always was (from
// the plan's creation). A consumer applies an authoritative copy stamped
// with Since e > 0 only once it has passed a fence of epoch e or later on
// every partition of the other side's topic (Stamp.Peer): every copy the
// other side held authority for was written before that fence.
func (h History) Since(slice int) int {
	if len(h) == 0 {
		return 0
	}
	cur := h[len(h)-1].Authority(slice)
	for i := len(h) - 1; i > 0; i-- {
		if h[i-1].Authority(slice) != cur {
			return h[i].Epoch
		}
	}
	return 0
}

// HeaderRoute names the route stamp every record of a migration carries
// (in Ferry's reserved namespace, so no event can forge it).
const HeaderRoute = "ferry.route"

// Stamp is a record's route: which plan and step routed it, its slice,
// the channel it was written to and its role there. An authoritative copy
// whose slice's authority moved to its side at epoch Since (> 0) names in
// Peer the topic of the same event on the other side, whose fences a
// consumer must pass before it applies the copy (History.Since).
type Stamp struct {
	Plan  string
	Epoch int
	Slice int
	Side  Side
	Role  Role
	Since int
	Peer  string
	// Bridged marks a copy the migration bridge made of a RabbitMQ old
	// channel's message (rendered as a trailing ";origin=bridge"): it
	// waits for the fences Since and Peer name, and no shadow of it ever
	// comes.
	Bridged bool
}

// bridgedSuffix ends a bridged copy's stamp.
const bridgedSuffix = ";origin=bridge"

// Alone reports whether the event has one copy only, with no shadow on
// the other channel: an authoritative copy of OLD_RETIRED, which the relay
// stamps with side new and no since (every other authoritative copy it
// writes on the new side has a since, as the new channel holds a slice
// only from an epoch after the plan's creation, History.Since), or a
// bridge's copy (no since from a Kafka old channel, Bridged from a
// RabbitMQ one).
func (st Stamp) Alone() bool {
	return st.Role == Authoritative && st.Side == NewSide && (st.Since == 0 || st.Bridged)
}

// String renders the stamp as HeaderRoute's value:
// "plan=move-1;epoch=3;slice=17;side=new;role=authoritative;since=3;peer=orders".
func (st Stamp) String() string { return string(st.Append(nil)) }

// Append appends the stamp's String to dst: a relay stamps every copy it
// writes, so one allocation (the header's value) is what a stamp costs.
func (st Stamp) Append(dst []byte) []byte {
	dst = append(dst, "plan="...)
	dst = append(dst, st.Plan...)
	dst = append(dst, ";epoch="...)
	dst = strconv.AppendInt(dst, int64(st.Epoch), 10)
	dst = append(dst, ";slice="...)
	dst = strconv.AppendInt(dst, int64(st.Slice), 10)
	dst = append(dst, ";side="...)
	dst = append(dst, st.Side...)
	dst = append(dst, ";role="...)
	dst = append(dst, st.Role...)
	dst = append(dst, ";since="...)
	dst = strconv.AppendInt(dst, int64(st.Since), 10)
	dst = append(dst, ";peer="...)
	dst = append(dst, st.Peer...)
	if st.Bridged {
		dst = append(dst, bridgedSuffix...)
	}
	return dst
}

// stampFixed is the length of a stamp's field names and separators.
const stampFixed = len("plan=;epoch=;slice=;side=;role=;since=;peer=")

// Bytes is the stamp's String as a slice of its own, sized for it.
func (st Stamp) Bytes() []byte {
	return st.Append(make([]byte, 0, stampFixed+len(st.Plan)+len(st.Side)+len(st.Role)+len(st.Peer)+len(bridgedSuffix)+3*20))
}

// ParseStamp reads a HeaderRoute value. It is strict: every field once, in
// order, with a valid value, then ";origin=bridge" or nothing; anything
// else is an error that names the problem, since a consumer acts on it.
//
// A consumer reads one per message of a migration: a valid stamp is read
// without a regular expression or an allocation (parseStampFast), and
// anything it does not take is read again by parseStamp, which names the
// problem.
func ParseStamp(v string) (Stamp, error) {
	if st, ok := parseStampFast(v); ok {
		return st, nil
	}
	return parseStamp(v)
}

// parseStampFast reads a valid stamp, and reports false for anything else:
// it takes nothing parseStamp refuses, and reads what it takes as
// parseStamp does (FuzzParseStamp holds it to that).
func parseStampFast(v string) (st Stamp, ok bool) {
	rest, bridged := strings.CutSuffix(v, bridgedSuffix)
	st.Bridged = bridged
	var val string
	if val, rest, ok = cutField(rest, "plan", false); !ok || !validPlanName(val) {
		return st, false
	}
	st.Plan = val
	if val, rest, ok = cutField(rest, "epoch", false); !ok {
		return st, false
	}
	if st.Epoch, ok = countFast(val, -1); !ok {
		return st, false
	}
	if val, rest, ok = cutField(rest, "slice", false); !ok {
		return st, false
	}
	if st.Slice, ok = countFast(val, Slices); !ok {
		return st, false
	}
	if val, rest, ok = cutField(rest, "side", false); !ok || (Side(val) != OldSide && Side(val) != NewSide) {
		return st, false
	}
	st.Side = Side(val)
	if val, rest, ok = cutField(rest, "role", false); !ok || (Role(val) != Authoritative && Role(val) != Shadow) {
		return st, false
	}
	st.Role = Role(val)
	if val, rest, ok = cutField(rest, "since", false); !ok {
		return st, false
	}
	if st.Since, ok = countFast(val, -1); !ok {
		return st, false
	}
	if val, _, ok = cutField(rest, "peer", true); !ok || (val != "" && !validTopicName(val)) {
		return st, false
	}
	st.Peer = val
	if st.Since > st.Epoch || (st.Since > 0) != (st.Peer != "") ||
		(st.Bridged && (st.Side != NewSide || st.Role != Authoritative || st.Since == 0)) {
		return st, false
	}
	return st, true
}

// cutField reads "key=value" at the start of s, up to the next ';' (which
// must follow, unless last: then no ';' may).
func cutField(s, key string, last bool) (val, rest string, ok bool) {
	if len(s) <= len(key) || s[:len(key)] != key || s[len(key)] != '=' {
		return "", "", false
	}
	s = s[len(key)+1:]
	i := strings.IndexByte(s, ';')
	if last {
		return s, "", i < 0
	}
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// countFast is parseCount for what it takes: a canonical non-negative
// integer below limit (no limit when limit < 0), of at most 9 digits.
func countFast(s string, limit int) (int, bool) {
	if s == "" || len(s) > 9 || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, limit < 0 || n < limit
}

// validPlanName is PlanName.MatchString without the regular expression.
func validPlanName(s string) bool {
	if s == "" || len(s) > 63 || !isLowerOrDigit(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isLowerOrDigit(c) && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

// validTopicName is topicName.MatchString without the regular expression.
func validTopicName(s string) bool {
	if s == "" || len(s) > 249 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isLowerOrDigit(c) && (c < 'A' || c > 'Z') && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

func isLowerOrDigit(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') }

// parseStamp is ParseStamp's careful reading, which names what is wrong.
func parseStamp(v string) (Stamp, error) {
	var st Stamp
	fields, bridged := strings.CutSuffix(v, bridgedSuffix)
	st.Bridged = bridged
	err := parseFields("route stamp", fields, []string{"plan", "epoch", "slice", "side", "role", "since", "peer"}, func(k, val string) error {
		var err error
		switch k {
		case "plan":
			st.Plan, err = parsePlanName(val)
		case "epoch":
			st.Epoch, err = parseCount(val, -1)
		case "slice":
			st.Slice, err = parseCount(val, Slices)
		case "side":
			st.Side, err = parseSide(val)
		case "role":
			if Role(val) != Authoritative && Role(val) != Shadow {
				return fmt.Errorf("%q (want authoritative or shadow)", val)
			}
			st.Role = Role(val)
		case "since":
			st.Since, err = parseCount(val, -1)
		case "peer":
			if val != "" && !topicName.MatchString(val) {
				return fmt.Errorf("%q is not a topic name", val)
			}
			st.Peer = val
		}
		return err
	})
	if err == nil && st.Since > st.Epoch {
		err = fmt.Errorf("migration: route stamp %q: since %d is after epoch %d", v, st.Since, st.Epoch)
	}
	if err == nil && (st.Since > 0) != (st.Peer != "") {
		err = fmt.Errorf("migration: route stamp %q: since and peer go together", v)
	}
	if err == nil && st.Bridged && (st.Side != NewSide || st.Role != Authoritative || st.Since == 0) {
		err = fmt.Errorf("migration: route stamp %q: a bridged copy is authoritative on the new side, with a since", v)
	}
	return st, err
}

// HeaderFence names a fence record's header. At the first event of each
// topic under a step, the relay writes a fence to every partition of the
// topic on each channel it writes (before the event), so a consumer that
// passed a partition's fence of epoch e has seen every record the relay
// wrote there under earlier steps. A fence has no key and no id: a
// consumer records it as passed and applies nothing. Its value is the
// other channel (Channel as JSON, which holds no secret), so a consumer of
// one channel learns where the other one is: the control record through
// which consumers follow a migration by themselves.
const HeaderFence = "ferry.fence"

// Fence is a fence record's meaning: written for plan's step epoch, on
// side, to each of the topic's Partitions partitions; Peer is the topic of
// the same events on the other side.
type Fence struct {
	Plan       string
	Epoch      int
	Side       Side
	Partitions int
	Peer       string
}

// String renders the fence as HeaderFence's value:
// "plan=move-1;epoch=3;side=old;partitions=6;peer=orders.v2".
func (f Fence) String() string {
	return "plan=" + f.Plan + ";epoch=" + strconv.Itoa(f.Epoch) + ";side=" + string(f.Side) +
		";partitions=" + strconv.Itoa(f.Partitions) + ";peer=" + f.Peer
}

// ParseFence reads a HeaderFence value, as strictly as ParseStamp.
func ParseFence(v string) (Fence, error) {
	var f Fence
	err := parseFields("fence", v, []string{"plan", "epoch", "side", "partitions", "peer"}, func(k, val string) error {
		var err error
		switch k {
		case "plan":
			f.Plan, err = parsePlanName(val)
		case "epoch":
			f.Epoch, err = parseCount(val, -1)
		case "side":
			f.Side, err = parseSide(val)
		case "partitions":
			f.Partitions, err = parseCount(val, -1)
			if err == nil && f.Partitions == 0 {
				err = errors.New("0 (want at least 1)")
			}
		case "peer":
			if !topicName.MatchString(val) {
				err = fmt.Errorf("%q is not a topic name", val)
			}
			f.Peer = val
		}
		return err
	})
	return f, err
}

// PlanName is a legal plan name: the migration's Plan.Name and the plan
// field of a stamp or a fence.
var PlanName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// topicName is a legal Kafka topic name.
var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// parseFields splits v into want's "key=value" fields, in order, and hands
// each to set; an error names what and v.
func parseFields(what, v string, want []string, set func(k, val string) error) error {
	fields := strings.Split(v, ";")
	if len(fields) != len(want) {
		return fmt.Errorf("migration: %s %q: want %d fields (%s)", what, v, len(want), strings.Join(want, ";"))
	}
	for i, f := range fields {
		k, val, ok := strings.Cut(f, "=")
		if !ok || k != want[i] {
			return fmt.Errorf("migration: %s %q: field %d is %q, want %s=", what, v, i+1, f, want[i])
		}
		if err := set(k, val); err != nil {
			return fmt.Errorf("migration: %s %q: %s %w", what, v, k, err)
		}
	}
	return nil
}

func parsePlanName(val string) (string, error) {
	if !PlanName.MatchString(val) {
		return "", fmt.Errorf("%q is not a plan name", val)
	}
	return val, nil
}

// parseCount reads a canonical non-negative integer below limit (no limit
// when limit < 0).
func parseCount(val string, limit int) (int, error) {
	n, err := strconv.Atoi(val)
	if err != nil || n < 0 || val != strconv.Itoa(n) || (limit >= 0 && n >= limit) {
		if limit >= 0 {
			return 0, fmt.Errorf("%q (want 0 to %d)", val, limit-1)
		}
		return 0, fmt.Errorf("%q (want a number from 0)", val)
	}
	return n, nil
}

func parseSide(val string) (Side, error) {
	if Side(val) != OldSide && Side(val) != NewSide {
		return "", fmt.Errorf("%q (want old or new)", val)
	}
	return Side(val), nil
}
