package relay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// The fast header parser agrees with encoding/json on everything it
// accepts, and hands everything else to it.
func TestParseHeadersMatchesJSON(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want map[string]string
	}{
		{`{}`, map[string]string{}},
		{` { } `, map[string]string{}},
		{`{"a": "1"}`, map[string]string{"a": "1"}},
		{`{"b": "2", "a": "1", "zz": ""}`, map[string]string{"a": "1", "b": "2", "zz": ""}},
		{`{"q": "say \"hi\"", "nl": "a\nb"}`, map[string]string{"q": `say "hi"`, "nl": "a\nb"}},
		{`{"u": "\u00e9t\u00e9"}`, map[string]string{"u": "été"}},
		{`{"n": 12, "o": {"x": 1}, "t": true}`, map[string]string{"n": "12", "o": `{"x": 1}`, "t": "true"}},
	}
	for _, c := range cases {
		hs, err := parseHeaders([]byte(c.in))
		if err != nil {
			t.Fatalf("parseHeaders(%s): %v", c.in, err)
		}
		got := map[string]string{}
		for i, h := range hs {
			if i > 0 && string(hs[i-1].Key) >= string(h.Key) {
				t.Fatalf("parseHeaders(%s): keys not sorted: %q then %q", c.in, hs[i-1].Key, h.Key)
			}
			got[string(h.Key)] = string(h.Value)
		}
		if len(got) != len(c.want) {
			t.Fatalf("parseHeaders(%s) = %v, want %v", c.in, got, c.want)
		}
		for k, v := range c.want {
			if got[k] != v {
				t.Fatalf("parseHeaders(%s)[%q] = %q, want %q", c.in, k, got[k], v)
			}
		}
	}
	for _, bad := range []string{`{`, `{"a": }`, `["a"]`, `{"a" "b"}`} {
		if _, err := parseHeaders([]byte(bad)); err == nil {
			t.Fatalf("parseHeaders(%s) accepted malformed JSON", bad)
		}
	}
}

func insertMessage(relID uint32, cols ...[]byte) []byte {
	msg := []byte{'I', 0, 0, 0, 0, 'N', 0, 0}
	binary.BigEndian.PutUint32(msg[1:5], relID)
	binary.BigEndian.PutUint16(msg[6:8], uint16(len(cols)))
	for _, c := range cols {
		if c == nil {
			msg = append(msg, 'n')
			continue
		}
		msg = append(msg, 'b')
		msg = binary.BigEndian.AppendUint32(msg, uint32(len(c)))
		msg = append(msg, c...)
	}
	return msg
}

func outboxRelation(t *testing.T) *relations {
	t.Helper()
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
		t.Fatal(err)
	}
	return rs
}

func TestDecodeInsert(t *testing.T) {
	t.Parallel()
	rs := outboxRelation(t)
	id := make([]byte, 16)
	id[15] = 9
	ts := binary.BigEndian.AppendUint64(nil, uint64(86_400_000_000)) // 2000-01-02
	msg := insertMessage(7, id, []byte("order"), []byte("o-1"), []byte("Placed"), []byte{0, 1, 2}, append([]byte{1}, `{"k": "v"}`...), ts)
	var r row
	ok, err := rs.decodeInsert(msg, &r)
	if err != nil || !ok {
		t.Fatalf("decodeInsert = %v, %v", ok, err)
	}
	if r.ID[15] != 9 || string(r.AggregateType) != "order" || string(r.AggregateID) != "o-1" || string(r.EventType) != "Placed" ||
		len(r.Payload) != 3 || r.Payload[2] != 2 || len(r.Headers) != 1 || string(r.Headers[0].Value) != "v" ||
		r.CreatedAt.Day() != 2 || r.CreatedAt.Year() != 2000 {
		t.Fatalf("decoded %+v", r)
	}

	// Every truncation is an error, never a panic or a short row.
	for n := 8; n < len(msg); n++ {
		if _, err := rs.decodeInsert(msg[:n], &row{}); !errors.Is(err, errShortInsert) {
			t.Fatalf("decodeInsert of %d of %d bytes: %v, want errShortInsert", n, len(msg), err)
		}
	}
	// A NULL in a required column is an error.
	bad := insertMessage(7, id, []byte("order"), nil, []byte("Placed"), []byte{}, nil, ts)
	if _, err := rs.decodeInsert(bad, &row{}); err == nil {
		t.Fatal("decodeInsert accepted a NULL aggregate_id")
	}
	// Another table's inserts are skipped; an unknown relation is an error.
	other := &pglogrepl.RelationMessage{RelationID: 8, Namespace: "public", RelationName: "orders"}
	if err := rs.add(other); err != nil {
		t.Fatal(err)
	}
	if ok, err := rs.decodeInsert(insertMessage(8, []byte("x")), &row{}); ok || err != nil {
		t.Fatalf("insert into orders: ok %v, err %v; want skipped", ok, err)
	}
	if _, err := rs.decodeInsert(insertMessage(9, []byte("x")), &row{}); err == nil {
		t.Fatal("insert into an unknown relation accepted")
	}
}

func TestRelationWithoutRequiredColumnIsFatal(t *testing.T) {
	t.Parallel()
	rs := newRelations()
	err := rs.add(&pglogrepl.RelationMessage{RelationID: 1, Namespace: "public", RelationName: "outbox",
		Columns: []*pglogrepl.RelationMessageColumn{{Name: "id"}}})
	if !errors.Is(err, ErrFatal) {
		t.Fatalf("add = %v, want a fatal error naming the missing column", err)
	}
}

// The in-place decoders of the messages every transaction brings read what
// pglogrepl's parsers read, and refuse what is cut short.
func TestDecodeBeginCommitXLogDataMatchPglogrepl(t *testing.T) {
	for _, us := range []int64{0, 1, -1, 818_000_000_123_456, -946_684_800_000_000, 1 << 50} {
		lsn := uint64(0x16_B374_D848 + us&0xffff)
		begin := binary.BigEndian.AppendUint64([]byte{'B'}, lsn)
		begin = binary.BigEndian.AppendUint64(begin, uint64(us))
		begin = binary.BigEndian.AppendUint32(begin, 7421)
		want, err := pglogrepl.Parse(begin)
		if err != nil {
			t.Fatal(err)
		}
		final, commit, err := decodeBegin(begin)
		if b := want.(*pglogrepl.BeginMessage); err != nil || final != b.FinalLSN || !commit.Equal(b.CommitTime) {
			t.Errorf("Begin at %d µs: %s %s %v, pglogrepl %s %s", us, final, commit, err, b.FinalLSN, b.CommitTime)
		}

		cm := binary.BigEndian.AppendUint64([]byte{'C', 0}, lsn-40)
		cm = binary.BigEndian.AppendUint64(cm, lsn)
		cm = binary.BigEndian.AppendUint64(cm, uint64(us))
		want, err = pglogrepl.Parse(cm)
		if err != nil {
			t.Fatal(err)
		}
		end, commit, err := decodeCommit(cm)
		if c := want.(*pglogrepl.CommitMessage); err != nil || end != c.TransactionEndLSN || !commit.Equal(c.CommitTime) {
			t.Errorf("Commit at %d µs: %s %s %v, pglogrepl %s %s", us, end, commit, err, c.TransactionEndLSN, c.CommitTime)
		}

		xld := binary.BigEndian.AppendUint64(nil, lsn)
		xld = binary.BigEndian.AppendUint64(xld, lsn+100)
		xld = binary.BigEndian.AppendUint64(xld, uint64(us))
		xld = append(xld, begin...)
		wantX, err := pglogrepl.ParseXLogData(xld)
		if err != nil {
			t.Fatal(err)
		}
		start, wal, err := decodeXLogData(xld)
		if err != nil || start != wantX.WALStart || !bytes.Equal(wal, wantX.WALData) {
			t.Errorf("XLogData: %s %x %v, pglogrepl %s %x", start, wal, err, wantX.WALStart, wantX.WALData)
		}

		for _, c := range []struct {
			msg    []byte
			decode func([]byte) error
		}{
			{begin, func(b []byte) error { _, _, err := decodeBegin(b); return err }},
			{cm, func(b []byte) error { _, _, err := decodeCommit(b); return err }},
			{xld[:24], func(b []byte) error { _, _, err := decodeXLogData(b); return err }},
		} {
			if err := c.decode(c.msg[:len(c.msg)-1]); err == nil {
				t.Errorf("%q cut short by a byte decoded without an error", c.msg[0])
			}
		}
	}
}
