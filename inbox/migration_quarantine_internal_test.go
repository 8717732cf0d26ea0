package inbox

import (
	"bytes"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A partition's position counts for the quarantine at a time when the
// group had consumed everything it held then, and only once the worker
// read its cluster for the quarantine delay without a failure: a copy held
// back while its cluster was down reaches it once the cluster is back, so
// an end read right then does not yet hold it.
func TestAPositionCountsOnlyOnceItsClusterAnsweredForTheDelay(t *testing.T) {
	t.Parallel()
	w := &Worker{marks: map[positionKey]positionMark{}, channelUp: map[channelKey]time.Time{}, unwatched: map[followKey]int64{}}
	w.cfg.MigrationQuarantineAfter = time.Minute
	ch := channelKey{"c", "move", "old"}
	k := positionKey{"c", "move", "old", "t", 0}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	note := func(now time.Duration, pos, end int64) (time.Time, bool) {
		valid := w.channelUpSince(ch, at(now)).Add(w.cfg.MigrationQuarantineAfter)
		return w.notePosition(k, pos, positionMark{end, at(now)}, valid)
	}
	// The cluster answers from t0: a group at the end counts from t0+1m.
	if _, ok := note(0, 10, 10); ok {
		t.Fatal("a position counted as soon as the cluster answered")
	}
	if r, ok := note(time.Minute, 10, 10); !ok || !r.Equal(at(time.Minute)) {
		t.Fatalf("a group at the end a minute after the cluster answered: %v %v, want it counted at once", r, ok)
	}
	// A busy partition: behind its end, the group counts from the last end
	// it passed, read at an earlier pass.
	if r, ok := note(2*time.Minute, 11, 20); !ok || !r.Equal(at(time.Minute)) {
		t.Fatalf("a group behind the end, past the one read at 1m: %v %v, want it counted at 1m", r, ok)
	}
	if _, ok := note(3*time.Minute, 15, 30); ok {
		t.Fatal("a group behind every end read counted")
	}
	if r, ok := note(4*time.Minute, 25, 40); !ok || !r.Equal(at(2*time.Minute)) {
		t.Fatalf("a group past the end read at 2m: %v %v, want it counted at 2m", r, ok)
	}
	// The cluster fails: its marks go, and a position counts again only a
	// minute after it answers anew.
	w.channelDown(ch)
	if len(w.marks) != 0 {
		t.Fatalf("marks kept across a failure: %v", w.marks)
	}
	if _, ok := note(10*time.Minute, 40, 40); ok {
		t.Fatal("a position counted as soon as the cluster was back")
	}
	if r, ok := note(11*time.Minute, 40, 40); !ok || !r.Equal(at(11*time.Minute)) {
		t.Fatalf("a minute after the cluster was back: %v %v, want it counted", r, ok)
	}
}

// A shadow's headers are stored exactly as json.Marshal writes them,
// whichever way encodeHeaders takes, and read back as they were.
func FuzzEncodeHeadersIsJSONMarshal(f *testing.F) {
	f.Add("ferry.route", []byte("plan=p;epoch=1"), false, "id", []byte{0, 0xff, '"'}, true)
	f.Add("a<b", []byte(nil), true, "é\n", []byte(""), false)
	f.Fuzz(func(t *testing.T, k1 string, v1 []byte, nil1 bool, k2 string, v2 []byte, nil2 bool) {
		if nil1 {
			v1 = nil
		}
		if nil2 {
			v2 = nil
		}
		for _, hs := range [][]kgo.RecordHeader{nil, {{Key: k1, Value: v1}}, {{Key: k1, Value: v1}, {Key: k2, Value: v2}}} {
			got, want := encodeHeaders(hs), marshalHeaders(hs)
			if !bytes.Equal(got, want) {
				t.Fatalf("encodeHeaders(%q) = %s, json.Marshal writes %s", hs, got, want)
			}
			back, err := decodeHeaders(got)
			if err != nil || len(back) != len(hs) {
				t.Fatalf("decodeHeaders(%s) = %v, %v", got, back, err)
			}
			for i := range hs {
				if utf8.ValidString(hs[i].Key) && (back[i].Key != hs[i].Key || !bytes.Equal(back[i].Value, hs[i].Value)) {
					t.Fatalf("header %d read back as %q, stored %q", i, back[i], hs[i])
				}
			}
		}
	})
}
