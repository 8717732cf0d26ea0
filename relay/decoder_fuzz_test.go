package relay

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// parseHeaders, whatever the bytes: it never panics; what it accepts is
// sorted by key with every key once; and its fast path agrees with
// encoding/json, the slow path, on every input it takes.
func FuzzParseHeaders(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { } `, `{"a": "1"}`, `{"b": "2", "a": "1", "zz": ""}`, `{"q": "say \"hi\"", "nl": "a\nb"}`,
		`{"u": "\u00e9t\u00e9"}`, `{"n": 12, "o": {"x": 1}, "t": true, "z": null}`, `{"a": "1", "a": "2"}`,
		`{"é": "ü"}`, "{\"a\": \"\x01\"}", "{\"a\": \"\xff\"}", `{`, `{"a": }`, `["a"]`, `{"a" "b"}`, `{"a": "1",}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		hs, err := parseHeaders(data)
		if err != nil {
			return
		}
		for i := 1; i < len(hs); i++ {
			if bytes.Compare(hs[i-1].Key, hs[i].Key) >= 0 {
				t.Fatalf("parseHeaders(%q): keys %q then %q, want sorted and unique", data, hs[i-1].Key, hs[i].Key)
			}
		}
		fast, ok := parseSimpleObject(data)
		if !ok {
			return
		}
		var want map[string]string
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("parseSimpleObject(%q) accepted what encoding/json refuses: %v", data, err)
		}
		got := map[string]string{}
		for _, h := range fast {
			got[string(h.Key)] = string(h.Value)
		}
		if len(fast) != len(want) || len(got) != len(want) {
			t.Fatalf("parseSimpleObject(%q) = %q, encoding/json reads %q", data, fast, want)
		}
		for k, v := range want {
			if w, ok := got[k]; !ok || w != v {
				t.Fatalf("parseSimpleObject(%q) = %q, encoding/json reads %q", data, fast, want)
			}
		}
	})
}

// fuzzRelations is the outbox relation of outboxRelation (id 7, binary
// types) plus another table's (id 8), without a *testing.T.
func fuzzRelations() *relations {
	rs := newRelations()
	rel := &pglogrepl.RelationMessage{RelationID: 7, Namespace: "public", RelationName: "outbox"}
	for _, c := range []struct {
		name string
		oid  uint32
	}{
		{"id", pgtype.UUIDOID}, {"aggregate_type", pgtype.TextOID}, {"aggregate_id", pgtype.TextOID},
		{"event_type", pgtype.TextOID}, {"payload", pgtype.ByteaOID}, {"headers", pgtype.JSONBOID},
		{"created_at", pgtype.TimestamptzOID},
	} {
		rel.Columns = append(rel.Columns, &pglogrepl.RelationMessageColumn{Name: c.name, DataType: c.oid})
	}
	if err := rs.add(rel); err != nil {
		panic(err)
	}
	if err := rs.add(&pglogrepl.RelationMessage{RelationID: 8, Namespace: "public", RelationName: "orders"}); err != nil {
		panic(err)
	}
	return rs
}

// textInsertMessage is insertMessage with every column in text format, as
// pgoutput sends it without the binary option.
func textInsertMessage(relID uint32, cols ...[]byte) []byte {
	msg := insertMessage(relID, cols...)
	for p := 8; p < len(msg); {
		if msg[p] == 'n' {
			p++
			continue
		}
		msg[p] = 't'
		p += 5 + int(binary.BigEndian.Uint32(msg[p+1:p+5]))
	}
	return msg
}

// decodeInsert, whatever the bytes: it never panics; it skips only inserts
// into other tables; decoding the same message twice (the scratch space is
// reused) gives the same row; an accepted row's headers are sorted with
// every key once; and the fast paths for binary uuid and timestamptz agree
// with pgtype's decoding of the same bytes.
func FuzzDecodeInsert(f *testing.F) {
	id := uuid.MustParse("0196a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
	ts := binary.BigEndian.AppendUint64(nil, uint64(86_400_000_000)) // 2000-01-02
	jsonb := func(s string) []byte { return append([]byte{1}, s...) }
	f.Add(insertMessage(7, id[:], []byte("order"), []byte("o-1"), []byte("Placed"), []byte{0, 1, 2}, jsonb(`{"k": "v"}`), ts))
	f.Add(insertMessage(7, id[:], []byte("order"), []byte("o-1"), []byte("Placed"), []byte{}, nil, ts))
	f.Add(insertMessage(7, id[:], []byte("order"), []byte("o-1"), []byte("Placed"), []byte("x"), jsonb(`{"q": "a\"b", "n": 1}`), ts))
	f.Add(insertMessage(7, id[:], []byte("order"), nil, []byte("Placed"), []byte{}, nil, ts))
	f.Add(insertMessage(7, id[:], []byte("order"), []byte("o-1"), []byte("Placed"), []byte{}, jsonb(`{}`),
		binary.BigEndian.AppendUint64(nil, math.MaxInt64))) // 'infinity'
	f.Add(insertMessage(7, id[:], []byte("order"), []byte("o-1"), []byte("Placed"), []byte{}, jsonb(`{}`),
		binary.BigEndian.AppendUint64(nil, uint64(31_556_952_000_000*1000)))) // about the year 3000
	f.Add(textInsertMessage(7, []byte(id.String()), []byte("order"), []byte("o-1"), []byte("Placed"), []byte(`\x00ff`),
		[]byte(`{"k": "v"}`), []byte("2026-05-01 12:00:00.123456+00")))
	f.Add(textInsertMessage(7, []byte(id.String()), []byte("order"), []byte("o-1"), []byte("Placed"), []byte(`\x0`),
		[]byte(`{"k": "v"}`), []byte("infinity")))
	f.Add(insertMessage(8, []byte("x")))
	f.Add(insertMessage(9, []byte("x")))
	f.Add([]byte{'I', 0, 0, 0, 7, 'N', 0xff, 0xff})
	f.Add([]byte(nil))
	f.Fuzz(func(t *testing.T, msg []byte) {
		rs := fuzzRelations()
		var r row
		ok, err := rs.decodeInsert(msg, &r)
		if !ok && err == nil && (len(msg) < 5 || binary.BigEndian.Uint32(msg[1:5]) != 8) {
			t.Fatalf("decodeInsert(%q) skipped an insert that is not into the other table", msg)
		}
		if !ok || err != nil {
			return
		}
		for i := 1; i < len(r.Headers); i++ {
			if bytes.Compare(r.Headers[i-1].Key, r.Headers[i].Key) >= 0 {
				t.Fatalf("decodeInsert(%q): header keys %q then %q, want sorted and unique", msg, r.Headers[i-1].Key, r.Headers[i].Key)
			}
		}
		rel := rs.byID[7]
		if j := rel.index[colCreatedAt]; rs.kinds[j] == pglogrepl.TupleDataTypeBinary && len(rs.datas[j]) == 8 {
			var want pgtype.Timestamptz
			if err := rs.typs.Scan(pgtype.TimestamptzOID, pgtype.BinaryFormatCode, rs.datas[j], &want); err != nil {
				t.Fatalf("pgtype refuses created_at %x: %v", rs.datas[j], err)
			}
			if !r.CreatedAt.Equal(want.Time) {
				t.Fatalf("created_at %x decoded as %v, pgtype reads %v", rs.datas[j], r.CreatedAt, want.Time)
			}
		}
		if j := rel.index[colID]; rs.kinds[j] == pglogrepl.TupleDataTypeBinary && len(rs.datas[j]) == 16 {
			var want pgtype.UUID
			if err := rs.typs.Scan(pgtype.UUIDOID, pgtype.BinaryFormatCode, rs.datas[j], &want); err != nil || r.ID != uuid.UUID(want.Bytes) {
				t.Fatalf("id %x decoded as %v, pgtype reads %x (%v)", rs.datas[j], r.ID, want.Bytes, err)
			}
		}

		var again row
		if ok, err := rs.decodeInsert(msg, &again); !ok || err != nil {
			t.Fatalf("decodeInsert(%q) again = %v, %v", msg, ok, err)
		}
		if r.ID != again.ID || !bytes.Equal(r.AggregateType, again.AggregateType) || !bytes.Equal(r.AggregateID, again.AggregateID) ||
			!bytes.Equal(r.EventType, again.EventType) || !bytes.Equal(r.Payload, again.Payload) || !r.CreatedAt.Equal(again.CreatedAt) ||
			!slices.EqualFunc(r.Headers, again.Headers, func(a, b header) bool { return bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value) }) {
			t.Fatalf("decodeInsert(%q) twice: %+v then %+v", msg, r, again)
		}
	})
}
