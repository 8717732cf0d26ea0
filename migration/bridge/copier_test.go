package bridge

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/payloadid"
	"github.com/ferryhq/ferry/internal/route"
	"github.com/ferryhq/ferry/migration"
	"github.com/ferryhq/ferry/outbox"
)

func hdr(kv ...string) []kgo.RecordHeader {
	var hs []kgo.RecordHeader
	for i := 0; i < len(kv); i += 2 {
		hs = append(hs, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return hs
}

func values(hs []kgo.RecordHeader, key string) []string {
	var out []string
	for _, h := range hs {
		if h.Key == key {
			out = append(out, string(h.Value))
		}
	}
	return out
}

// Each way of choosing the id gives the copy exactly one id header (or the
// record's own ambiguous ones, untouched), keeps every other header, and
// replaces an incoming route stamp with the bridge's.
func TestCopyCarriesOneIDAndTheBridgesStamp(t *testing.T) {
	t.Parallel()
	key, value := []byte("k1"), []byte("v1")
	derived := payloadid.Of(key, value)
	step := route.Step{Plan: "move-1", Epoch: 4, Phase: migration.DualWrite}
	stamp := route.Stamp{Plan: "move-1", Epoch: 4, Slice: route.Slice(key), Side: migration.NewSide, Role: route.Authoritative}.String()
	cases := []struct {
		name        string
		c           copier
		in          []kgo.RecordHeader
		wantIDs     []string
		wantDerived bool
		want        []string // other headers that must stay, key=value
	}{
		{"id header kept", copier{idHeader: outbox.HeaderID}, hdr("a", "1", "id", "e-1", "b", "2"), []string{"e-1"}, false, []string{"a=1", "b=2"}},
		{"no id: derived", copier{idHeader: outbox.HeaderID}, hdr("a", "1"), []string{derived}, true, []string{"a=1"}},
		{"empty id: derived", copier{idHeader: outbox.HeaderID}, hdr("id", ""), []string{derived}, true, nil},
		{"forged stamp replaced", copier{idHeader: outbox.HeaderID}, hdr("id", "e-2", route.HeaderRoute, "plan=x;epoch=9;slice=1;side=new;role=authoritative", route.HeaderRoute, "junk"), []string{"e-2"}, false, nil},
		{"another header", copier{idHeader: "msg-id"}, hdr("msg-id", "m-9", "id", "stale"), []string{"m-9"}, false, []string{"msg-id=m-9"}},
		{"another header missing: derived", copier{idHeader: "msg-id"}, hdr("id", "stale"), []string{derived}, true, nil},
		{"from payload", copier{idHeader: outbox.HeaderID, fromPayload: true}, hdr("id", "e-3", "c", "3"), []string{derived}, true, []string{"c=3"}},
		{"ambiguous ids untouched", copier{idHeader: outbox.HeaderID}, hdr("id", "e-4", "id", "e-5"), []string{"e-4", "e-5"}, false, nil},
	}
	ts := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range cases {
		tc.c.plan, tc.c.template = "move-1", TopicPlaceholder
		in := &kgo.Record{Topic: "orders", Partition: 2, Offset: 77, Key: key, Value: value, Headers: tc.in, Timestamp: ts}
		before := slices.Clone(tc.in)
		out, gotDerived, ok := tc.c.copyOf(in, step)
		if !ok {
			t.Fatalf("%s: no copy in DUAL_WRITE", tc.name)
		}
		if ids := values(out.Headers, outbox.HeaderID); !slices.Equal(ids, tc.wantIDs) || gotDerived != tc.wantDerived {
			t.Errorf("%s: ids %q derived %t, want %q %t", tc.name, ids, gotDerived, tc.wantIDs, tc.wantDerived)
		}
		if st := values(out.Headers, route.HeaderRoute); !slices.Equal(st, []string{stamp}) {
			t.Errorf("%s: stamps %q, want only %q", tc.name, st, stamp)
		}
		for _, kv := range tc.want {
			k, v, _ := strings.Cut(kv, "=")
			if !slices.Contains(values(out.Headers, k), v) {
				t.Errorf("%s: header %s=%s lost", tc.name, k, v)
			}
		}
		if out.Topic != "orders" || string(out.Key) != "k1" || string(out.Value) != "v1" || !out.Timestamp.Equal(ts) || out.Partition != 0 || out.Offset != 0 {
			t.Errorf("%s: copy %+v does not keep topic, key, value and timestamp", tc.name, out)
		}
		if !slices.EqualFunc(in.Headers, before, func(a, b kgo.RecordHeader) bool { return a.Key == b.Key && string(a.Value) == string(b.Value) }) {
			t.Errorf("%s: the original's headers changed: %v", tc.name, in.Headers)
		}
	}
}

// The role follows Step.Route for the new side, per slice; OLD_ONLY makes
// no copy.
func TestCopyRoleFollowsTheStep(t *testing.T) {
	t.Parallel()
	c := copier{plan: "move-1", idHeader: outbox.HeaderID, template: TopicPlaceholder}
	var moved, unmoved []byte
	for i := 0; moved == nil || unmoved == nil; i++ {
		k := []byte("agg-" + strconv.Itoa(i))
		if route.Slice(k) < 40 {
			moved = k
		} else {
			unmoved = k
		}
	}
	cases := []struct {
		step route.Step
		key  []byte
		role route.Role // "" for no copy
	}{
		{route.Step{Phase: migration.OldOnly}, moved, ""},
		{route.Step{Phase: migration.DualWrite, Epoch: 1}, moved, route.Authoritative},
		{route.Step{Phase: migration.Cutover, Epoch: 2, Slices: 40}, moved, route.Authoritative},
		{route.Step{Phase: migration.Cutover, Epoch: 2, Slices: 40}, unmoved, route.Authoritative},
		{route.Step{Phase: migration.OldRetired, Epoch: 3}, unmoved, route.Authoritative},
	}
	for _, tc := range cases {
		out, _, ok := c.copyOf(&kgo.Record{Topic: "t", Key: tc.key}, tc.step)
		if ok != (tc.role != "") {
			t.Fatalf("%s: copy %t, want %t", tc.step.Phase, ok, tc.role != "")
		}
		if !ok {
			continue
		}
		st, err := route.ParseStamp(values(out.Headers, route.HeaderRoute)[0])
		if err != nil {
			t.Fatal(err)
		}
		if st.Role != tc.role || st.Side != migration.NewSide || st.Epoch != tc.step.Epoch || st.Slice != route.Slice(tc.key) {
			t.Errorf("%s %d, slice %d: stamp %+v, want role %s", tc.step.Phase, tc.step.Slices, route.Slice(tc.key), st, tc.role)
		}
	}
}

func TestNewTopicMapsThenTemplates(t *testing.T) {
	t.Parallel()
	m := map[string]string{"orders": "orders.v2"}
	if got := newTopic(m, "b.{topic}", "orders"); got != "orders.v2" {
		t.Errorf("mapped topic %s", got)
	}
	if got := newTopic(m, "b.{topic}", "stock"); got != "b.stock" {
		t.Errorf("templated topic %s", got)
	}
}
