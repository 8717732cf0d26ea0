package inbox

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/payloadid"
	"github.com/ferryhq/ferry/outbox"
)

// fuzzHeaderNames are the header names the fuzzers' input can pick by
// number, so that Ferry's own headers (and repeats of them) come up as often
// as arbitrary ones.
var fuzzHeaderNames = []string{
	outbox.HeaderID, outbox.HeaderEventType, outbox.HeaderAggregateType, outbox.HeaderAggregateID,
	HeaderDeadLetterReason, HeaderDeadLetterError, HeaderDeadLetterAttempts, HeaderDeadLetterOriginalTopic,
	HeaderDeadLetterOriginalPartition, HeaderDeadLetterOriginalOffset, HeaderDeadLetterOriginalTimestamp,
	HeaderDeadLetterConsumer, HeaderDeadLetterFailedAt, HeaderRedrivenFrom,
}

// fuzzHeaders turns fuzz input into record headers. Each header is a
// selector byte, then a length-prefixed name (used when the selector picks
// no known name) and a length-prefixed value; input that ends early ends
// the list.
func fuzzHeaders(b []byte) []kgo.RecordHeader {
	var hs []kgo.RecordHeader
	next := func() ([]byte, bool) {
		if len(b) == 0 || int(b[0]) > len(b)-1 {
			return nil, false
		}
		s := b[1 : 1+int(b[0])]
		b = b[1+int(b[0]):]
		return s, true
	}
	for len(b) > 0 {
		sel := int(b[0])
		b = b[1:]
		name, ok := next()
		if !ok {
			break
		}
		value, ok := next()
		if !ok {
			break
		}
		key := string(name)
		if sel < len(fuzzHeaderNames) {
			key = fuzzHeaderNames[sel]
		}
		hs = append(hs, kgo.RecordHeader{Key: key, Value: value})
	}
	return hs
}

// encodeFuzzHeaders is fuzzHeaders' inverse, for seeds: pairs of name and
// value, names picked from fuzzHeaderNames when they are there.
func encodeFuzzHeaders(kv ...string) []byte {
	var b []byte
	for i := 0; i < len(kv); i += 2 {
		sel := slices.Index(fuzzHeaderNames, kv[i])
		name := ""
		if sel < 0 {
			sel, name = 255, kv[i]
		}
		b = append(b, byte(sel), byte(len(name)))
		b = append(b, name...)
		b = append(b, byte(len(kv[i+1])))
		b = append(b, kv[i+1]...)
	}
	return b
}

// newMessage, whatever the headers: it never panics; an accepted message's
// id is non-empty valid UTF-8 text without NUL of at most MaxIDLength bytes,
// taken from the id header or, when allowed, hashed from key and value;
// Ferry's headers reach the message unchanged; a record that carries one of
// Ferry's headers twice is refused as undecodable.
func FuzzNewMessage(f *testing.F) {
	f.Add([]byte("k"), []byte("v"), encodeFuzzHeaders("id", "abc", "event_type", "Placed", "aggregate_type", "order", "aggregate_id", "7", "trace", "x"), false)
	f.Add([]byte("k"), []byte("v"), encodeFuzzHeaders("id", "abc", "event_type", "Placed", "event_type", "Forged"), false)
	f.Add([]byte("k"), []byte("v"), encodeFuzzHeaders("id", "a", "id", "b"), true)
	f.Add([]byte(""), []byte(""), encodeFuzzHeaders("id", ""), true)
	f.Add([]byte("k"), []byte("v"), encodeFuzzHeaders("id", "a\x00b"), false)
	f.Add([]byte("k"), []byte("v"), encodeFuzzHeaders("id", "\xff\xfe"), false)
	f.Add([]byte("k"), []byte("v"), encodeFuzzHeaders("id", strings.Repeat("x", 250)), false)
	f.Add([]byte(nil), []byte(nil), []byte(nil), false)
	f.Fuzz(func(t *testing.T, key, value, headers []byte, hashIDs bool) {
		hs := fuzzHeaders(headers)
		r := &kgo.Record{Topic: "orders", Partition: 3, Offset: 9, Key: key, Value: value, Headers: hs}
		m, bad := newMessage("c", r, hashIDs, time.Time{})
		if (m == nil) == (bad == nil) {
			t.Fatalf("newMessage = %v, %v: want exactly one of a message and a failure", m, bad)
		}

		count := map[string]int{}
		first := map[string]string{}
		for _, h := range hs {
			if count[h.Key] == 0 {
				first[h.Key] = string(h.Value)
			}
			count[h.Key]++
		}
		for _, name := range outbox.ReservedHeaders {
			if count[name] > 1 {
				if m != nil || bad.reason != ReasonUndecodable {
					t.Fatalf("header %q appears %d times: newMessage = %+v, %v; want refused as undecodable", name, count[name], m, bad)
				}
				return
			}
		}
		id := first[outbox.HeaderID]
		if bad != nil {
			switch {
			case id == "" && !hashIDs:
				if bad.reason != ReasonMissingID {
					t.Fatalf("no id: failure %v, want %s", bad, ReasonMissingID)
				}
			case id != "" && len(id) <= MaxIDLength && utf8.ValidString(id) && !strings.ContainsRune(id, 0):
				t.Fatalf("usable id %q refused: %v", id, bad)
			case bad.reason != ReasonUndecodable && !(id == "" && !hashIDs):
				t.Fatalf("id %q: failure %v, want %s", id, bad, ReasonUndecodable)
			}
			return
		}

		if m.ID == "" || len(m.ID) > MaxIDLength || !utf8.ValidString(m.ID) || strings.ContainsRune(m.ID, 0) {
			t.Fatalf("accepted a message with id %q", m.ID)
		}
		switch {
		case id != "" && m.ID != id:
			t.Fatalf("id %q, want the id header %q", m.ID, id)
		case id == "" && (!hashIDs || m.ID != payloadid.Of(key, value)):
			t.Fatalf("id %q for a record without an id header (hashIDs %v)", m.ID, hashIDs)
		}
		if m.EventType != first[outbox.HeaderEventType] || m.AggregateType != first[outbox.HeaderAggregateType] ||
			m.AggregateID != first[outbox.HeaderAggregateID] {
			t.Fatalf("message %q/%q/%q, want the headers' %q/%q/%q", m.EventType, m.AggregateType, m.AggregateID,
				first[outbox.HeaderEventType], first[outbox.HeaderAggregateType], first[outbox.HeaderAggregateID])
		}
		if m.Topic != r.Topic || m.Partition != r.Partition || m.Offset != r.Offset || !bytes.Equal(m.Key, key) ||
			!bytes.Equal(m.Payload, value) || len(m.Headers) != len(hs) {
			t.Fatalf("message %+v does not carry record %+v", m, r)
		}
	})
}

// ParseDeadLetter, whatever the headers: it never panics and always returns
// a dead letter; no header in Ferry's dead-letter namespace is among the
// returned Headers, and the others are all there, in order; it succeeds
// only with a usable origin. And a dead letter the worker writes parses
// back to the record it came from.
func FuzzParseDeadLetter(f *testing.F) {
	valid := func(extra ...string) []byte {
		return encodeFuzzHeaders(append([]string{"id", "e-1", "trace", "t",
			HeaderDeadLetterReason, string(ReasonPermanent), HeaderDeadLetterError, "no such order", HeaderDeadLetterAttempts, "3",
			HeaderDeadLetterOriginalTopic, "orders", HeaderDeadLetterOriginalPartition, "2", HeaderDeadLetterOriginalOffset, "41",
			HeaderDeadLetterOriginalTimestamp, "2026-05-01T12:00:00.123Z", HeaderDeadLetterConsumer, "reserva",
			HeaderDeadLetterFailedAt, "2026-05-01T12:00:01Z"}, extra...)...)
	}
	f.Add(valid(), int32(2), int64(41))
	f.Add(valid(HeaderDeadLetterOriginalPartition, "x"), int32(0), int64(0))
	f.Add(valid(HeaderDeadLetterOriginalTopic, ""), int32(-1), int64(-1))
	f.Add(valid(HeaderDeadLetterOriginalPartition, "99999999999"), int32(7), int64(1<<62))
	f.Add(encodeFuzzHeaders("ferry.dlq.forged", "x", "ferry.dlq", "y", "id", ""), int32(0), int64(0))
	f.Add([]byte(nil), int32(0), int64(0))
	f.Fuzz(func(t *testing.T, headers []byte, partition int32, offset int64) {
		hs := fuzzHeaders(headers)
		r := &kgo.Record{Topic: "orders.dlq", Partition: 1, Offset: 5, Key: []byte("k"), Value: []byte("v"), Headers: hs}
		d, err := ParseDeadLetter(r)
		if d == nil {
			t.Fatalf("ParseDeadLetter = nil, %v", err)
		}
		var kept []kgo.RecordHeader
		var topic, part string
		var haveTopic, havePart bool
		for _, h := range hs {
			switch h.Key {
			case HeaderDeadLetterOriginalTopic:
				topic, haveTopic = string(h.Value), true
			case HeaderDeadLetterOriginalPartition:
				part, havePart = string(h.Value), true
			}
			if !strings.HasPrefix(h.Key, deadLetterHeaderPrefix) {
				kept = append(kept, h)
			}
		}
		checkKept(t, d.Headers, kept)
		if err == nil {
			n, perr := strconv.ParseInt(part, 10, 32)
			if !haveTopic || topic == "" || d.OriginalTopic != topic || !havePart || perr != nil || d.OriginalPartition != int32(n) {
				t.Fatalf("accepted a dead letter with origin %q/%q (have %v/%v): parsed %q/%d", topic, part, haveTopic, havePart,
					d.OriginalTopic, d.OriginalPartition)
			}
		}

		// What the worker writes reads back as what it consumed.
		orig := &kgo.Record{Topic: "orders", Partition: partition, Offset: offset, Key: r.Key, Value: r.Value, Headers: hs,
			Timestamp: time.Date(2026, 5, 1, 12, 0, 0, 123, time.UTC)}
		failedAt := time.Date(2026, 5, 1, 12, 0, 1, 0, time.UTC)
		dl := deadLetterRecord(orig, "orders.dlq", "reserva", string(ReasonPermanent), errors.New("no such order"), 3, failedAt)
		d, err = ParseDeadLetter(dl)
		if err != nil {
			t.Fatalf("ParseDeadLetter of the worker's own dead letter: %v", err)
		}
		checkKept(t, d.Headers, kept)
		wantID := ""
		for _, h := range kept {
			if h.Key == outbox.HeaderID && len(h.Value) > 0 {
				wantID = string(h.Value)
				break
			}
		}
		if d.OriginalTopic != orig.Topic || d.OriginalPartition != partition || d.OriginalOffset != offset ||
			!d.OriginalTimestamp.Equal(orig.Timestamp) || !d.FailedAt.Equal(failedAt) || d.Consumer != "reserva" ||
			d.Reason != ReasonPermanent || d.Attempts != 3 || d.ID != wantID {
			t.Fatalf("dead letter of %+v parsed as %+v", orig, d)
		}
	})
}

func checkKept(t *testing.T, got, want []kgo.RecordHeader) {
	t.Helper()
	for _, h := range got {
		if strings.HasPrefix(h.Key, deadLetterHeaderPrefix) {
			t.Fatalf("dead-letter header %q among the original headers", h.Key)
		}
	}
	if !slices.EqualFunc(got, want, func(a, b kgo.RecordHeader) bool { return a.Key == b.Key && bytes.Equal(a.Value, b.Value) }) {
		t.Fatalf("headers %v, want %v", got, want)
	}
}
