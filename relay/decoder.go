package relay

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/migration"
)

// row is one outbox insert as decoded from the WAL. Its byte fields point
// into the message they were decoded from, which must not be reused while
// the row is in flight.
type row struct {
	ID            uuid.UUID
	AggregateType []byte
	AggregateID   []byte
	EventType     []byte
	Payload       []byte
	Headers       []header // the row's own headers, sorted by key
	CreatedAt     time.Time
}

type header struct{ Key, Value []byte }

// Positions of the columns the relay reads in relation.index.
const (
	colID = iota
	colAggregateType
	colAggregateID
	colEventType
	colPayload
	colHeaders
	colCreatedAt
	numColumns
)

// outboxColumns are the columns the relay reads, by name: a column added to
// outbox later is ignored, and one that moved keeps working.
var outboxColumns = [numColumns]string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at"}

// relation is a Relation message turned into column positions.
type relation struct {
	name   string // schema.table
	outbox bool
	ncols  int
	index  [numColumns]int // position of each outboxColumns entry
	oids   [numColumns]uint32
	// ferry_migration_step, whose inserts are a live migration's steps
	// (decodeStep): its columns' names and types.
	step  bool
	names []string
	types []uint32
}

// relations caches Relation messages. PostgreSQL sends one before the first
// change of a table on every connection, and again after the table's DDL.
type relations struct {
	byID map[uint32]*relation
	typs *pgtype.Map
	// Scratch space for one tuple, reused by every insert.
	kinds []byte
	datas [][]byte
}

func newRelations() *relations {
	return &relations{byID: make(map[uint32]*relation), typs: pgtype.NewMap()}
}

func (rs *relations) add(m *pglogrepl.RelationMessage) error {
	r := &relation{name: m.Namespace + "." + m.RelationName, outbox: m.RelationName == "outbox", ncols: len(m.Columns)}
	if r.outbox {
		for i, name := range outboxColumns {
			j := slices.IndexFunc(m.Columns, func(c *pglogrepl.RelationMessageColumn) bool { return c.Name == name })
			if j < 0 {
				return fmt.Errorf("%w: table %s has no column %q; Ferry's migrations create it", ErrFatal, r.name, name)
			}
			r.index[i] = j
			r.oids[i] = m.Columns[j].DataType
		}
	}
	if m.RelationName == "ferry_migration_step" {
		r.step = true
		for _, c := range m.Columns {
			r.names = append(r.names, c.Name)
			r.types = append(r.types, c.DataType)
		}
	}
	rs.byID[m.RelationID] = r
	return nil
}

// decodeStep decodes an insert into ferry_migration_step; ok is false for
// other tables. Steps are rare: it takes pglogrepl's general path.
func (rs *relations) decodeStep(msg []byte) (st stepRow, ok bool, err error) {
	if len(msg) < 5 {
		return st, false, errShortInsert
	}
	r := rs.byID[binary.BigEndian.Uint32(msg[1:5])]
	if r == nil || !r.step {
		return st, false, nil
	}
	parsed, err := pglogrepl.Parse(msg)
	if err != nil {
		return st, true, fmt.Errorf("parse a ferry_migration_step insert: %w", err)
	}
	ins, isInsert := parsed.(*pglogrepl.InsertMessage)
	if !isInsert || ins.Tuple == nil || len(ins.Tuple.Columns) != len(r.names) {
		return st, true, fmt.Errorf("a ferry_migration_step insert does not match its relation (%d columns)", len(r.names))
	}
	var epoch, slices int32
	var phase string
	found := 0
	for i, c := range ins.Tuple.Columns {
		var dst any
		switch r.names[i] {
		case "migration":
			dst = &st.Plan
		case "epoch":
			dst = &epoch
		case "phase":
			dst = &phase
		case "slices":
			dst = &slices
		case "seq":
			dst = &st.Seq
		default:
			continue
		}
		format := int16(pgtype.TextFormatCode)
		if c.DataType == pglogrepl.TupleDataTypeBinary {
			format = pgtype.BinaryFormatCode
		}
		if c.DataType != pglogrepl.TupleDataTypeBinary && c.DataType != pglogrepl.TupleDataTypeText {
			return st, true, fmt.Errorf("ferry_migration_step column %q is NULL", r.names[i])
		}
		if err := rs.typs.Scan(r.types[i], format, c.Data, dst); err != nil {
			return st, true, fmt.Errorf("ferry_migration_step column %q: %w", r.names[i], err)
		}
		found++
	}
	if found != 5 {
		return st, true, fmt.Errorf("%w: table ferry_migration_step lacks a column the relay reads (migration, epoch, phase, slices, seq): "+
			"run `relay schema` (Ferry's migrations)", ErrFatal)
	}
	st.Epoch, st.Slices = int(epoch), int(slices)
	st.Phase, err = migration.ParsePhase(phase)
	return st, true, err
}

var errShortInsert = errors.New("truncated pgoutput Insert message")

// decodeInsert decodes a pgoutput Insert message ('I', relation id, 'N',
// tuple) without allocating per column. ok is false for tables other than
// outbox, which a publication may also carry.
func (rs *relations) decodeInsert(msg []byte, ev *row) (ok bool, err error) {
	if len(msg) < 8 || msg[5] != 'N' {
		return false, errShortInsert
	}
	relID := binary.BigEndian.Uint32(msg[1:5])
	r := rs.byID[relID]
	if r == nil {
		return false, fmt.Errorf("insert into relation %d before its Relation message", relID)
	}
	if !r.outbox {
		return false, nil
	}
	n := int(binary.BigEndian.Uint16(msg[6:8]))
	rs.kinds, rs.datas = rs.kinds[:0], rs.datas[:0]
	p := 8
	for range n {
		if p >= len(msg) {
			return true, errShortInsert
		}
		kind := msg[p]
		p++
		var data []byte
		if kind == pglogrepl.TupleDataTypeText || kind == pglogrepl.TupleDataTypeBinary {
			if p+4 > len(msg) {
				return true, errShortInsert
			}
			l := int(binary.BigEndian.Uint32(msg[p : p+4]))
			p += 4
			if p+l > len(msg) {
				return true, errShortInsert
			}
			data = msg[p : p+l : p+l]
			p += l
		}
		rs.kinds = append(rs.kinds, kind)
		rs.datas = append(rs.datas, data)
	}
	for i, name := range outboxColumns {
		j := r.index[i]
		if j >= n {
			return true, fmt.Errorf("outbox insert has %d columns, column %q is number %d", n, name, j+1)
		}
		kind := rs.kinds[j]
		if kind == pglogrepl.TupleDataTypeNull || kind == pglogrepl.TupleDataTypeToast {
			if i == colHeaders {
				continue
			}
			return true, fmt.Errorf("outbox column %q is NULL", name)
		}
		if err := rs.decodeColumn(ev, i, r.oids[i], kind == pglogrepl.TupleDataTypeBinary, rs.datas[j]); err != nil {
			return true, fmt.Errorf("outbox column %q: %w", name, err)
		}
	}
	return true, nil
}

func (rs *relations) decodeColumn(ev *row, col int, oid uint32, binaryData bool, data []byte) error {
	switch col {
	case colID:
		if binaryData && oid == pgtype.UUIDOID && len(data) == 16 {
			copy(ev.ID[:], data)
			return nil
		}
		id, err := uuid.ParseBytes(data)
		ev.ID = id
		return err
	case colAggregateType:
		ev.AggregateType = data
	case colAggregateID:
		ev.AggregateID = data
	case colEventType:
		ev.EventType = data
	case colPayload:
		if binaryData {
			ev.Payload = data
			return nil
		}
		s, ok := bytes.CutPrefix(data, []byte(`\x`))
		if !ok {
			return errors.New(`text bytea without \x prefix`)
		}
		ev.Payload = make([]byte, hex.DecodedLen(len(s)))
		_, err := hex.Decode(ev.Payload, s)
		return err
	case colHeaders:
		if binaryData && oid == pgtype.JSONBOID {
			if len(data) == 0 || data[0] != 1 {
				return errors.New("unknown jsonb binary version")
			}
			data = data[1:]
		}
		hs, err := parseHeaders(data)
		ev.Headers = hs
		return err
	case colCreatedAt:
		// The fast path holds within 292 years of 2000, where microseconds
		// fit a time.Duration; pgtype decodes the rest, 'infinity' included
		// (they used to wrap around to a wrong time).
		if binaryData && oid == pgtype.TimestamptzOID && len(data) == 8 {
			if us := int64(binary.BigEndian.Uint64(data)); us > -maxDurationMicros && us < maxDurationMicros {
				ev.CreatedAt = pgEpoch.Add(time.Duration(us) * time.Microsecond)
				return nil
			}
		}
		var ts pgtype.Timestamptz
		format := int16(pgtype.TextFormatCode)
		if binaryData {
			format = pgtype.BinaryFormatCode
		}
		if err := rs.typs.Scan(oid, format, data, &ts); err != nil {
			return err
		}
		ev.CreatedAt = ts.Time
	}
	return nil
}

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

const maxDurationMicros = int64(math.MaxInt64 / time.Microsecond)

// parseHeaders reads the headers object. The common case, an object of
// strings without escapes as jsonb prints it, is sliced in place; anything
// else (escapes, a non-string value written by hand, which travels as its
// JSON text) goes through encoding/json.
func parseHeaders(data []byte) ([]header, error) {
	if hs, ok := parseSimpleObject(data); ok {
		return hs, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	hs := make([]header, 0, len(m))
	for k, raw := range m {
		v := []byte(raw)
		if len(raw) > 0 && raw[0] == '"' {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, err
			}
			v = []byte(s)
		}
		hs = append(hs, header{[]byte(k), v})
	}
	slices.SortFunc(hs, func(a, b header) int { return bytes.Compare(a.Key, b.Key) })
	return hs, nil
}

// parseSimpleObject parses {"k": "v", ...} whose strings have no escapes.
// jsonb prints keys sorted (by length, then bytes), unique. What it would
// read differently from encoding/json (a repeated key, a control byte,
// invalid UTF-8, bytes after the object) it leaves to the slow path.
func parseSimpleObject(d []byte) ([]header, bool) {
	p := skipSpace(d, 0)
	if p >= len(d) || d[p] != '{' {
		return nil, false
	}
	p = skipSpace(d, p+1)
	if p < len(d) && d[p] == '}' {
		return nil, skipSpace(d, p+1) == len(d)
	}
	var hs []header
	for {
		k, np, ok := simpleString(d, p)
		if !ok {
			return nil, false
		}
		p = skipSpace(d, np)
		if p >= len(d) || d[p] != ':' {
			return nil, false
		}
		v, np, ok := simpleString(d, skipSpace(d, p+1))
		if !ok {
			return nil, false
		}
		hs = append(hs, header{k, v})
		p = skipSpace(d, np)
		if p >= len(d) {
			return nil, false
		}
		if d[p] == '}' {
			if skipSpace(d, p+1) != len(d) {
				return nil, false
			}
			break
		}
		if d[p] != ',' {
			return nil, false
		}
		p = skipSpace(d, p+1)
	}
	slices.SortFunc(hs, func(a, b header) int { return bytes.Compare(a.Key, b.Key) })
	for i := 1; i < len(hs); i++ {
		if bytes.Equal(hs[i-1].Key, hs[i].Key) {
			return nil, false
		}
	}
	return hs, true
}

func skipSpace(d []byte, p int) int {
	for p < len(d) && (d[p] == ' ' || d[p] == '\n' || d[p] == '\t' || d[p] == '\r') {
		p++
	}
	return p
}

// simpleString reads a JSON string starting at d[p] that has no escapes,
// no control bytes and is valid UTF-8.
func simpleString(d []byte, p int) (s []byte, next int, ok bool) {
	if p >= len(d) || d[p] != '"' {
		return nil, 0, false
	}
	end := bytes.IndexByte(d[p+1:], '"')
	if end < 0 {
		return nil, 0, false
	}
	s = d[p+1 : p+1+end : p+1+end]
	ascii := true
	for _, c := range s {
		if c == '\\' || c < 0x20 {
			return nil, 0, false
		}
		ascii = ascii && c < utf8.RuneSelf
	}
	if !ascii && !utf8.Valid(s) {
		return nil, 0, false
	}
	return s, p + 2 + end, true
}

// pgEpochMicros is PostgreSQL's epoch, 2000-01-01 UTC, in microseconds
// since the Unix epoch: its timestamps count from it.
const pgEpochMicros = 946684800 * 1_000_000

var (
	errShortXLogData = errors.New("truncated XLogData message")
	errShortBegin    = errors.New("truncated pgoutput Begin message")
	errShortCommit   = errors.New("truncated pgoutput Commit message")
)

// decodeXLogData decodes an XLogData message (after its 'w': WAL start,
// server WAL end, server time, WAL data) in place: the WAL data is msg's,
// and the server's clock is not read.
func decodeXLogData(msg []byte) (start pglogrepl.LSN, wal []byte, err error) {
	if len(msg) < 24 {
		return 0, nil, errShortXLogData
	}
	return pglogrepl.LSN(binary.BigEndian.Uint64(msg[0:8])), msg[24:], nil
}

// decodeBegin decodes a pgoutput Begin message ('B', final LSN, commit
// time, xid) without allocating, as pglogrepl.Parse would.
func decodeBegin(msg []byte) (final pglogrepl.LSN, commit time.Time, err error) {
	if len(msg) < 21 {
		return 0, time.Time{}, errShortBegin
	}
	return pglogrepl.LSN(binary.BigEndian.Uint64(msg[1:9])), pgTime(msg[9:17]), nil
}

// decodeCommit decodes a pgoutput Commit message ('C', flags, commit LSN,
// transaction end LSN, commit time) without allocating.
func decodeCommit(msg []byte) (end pglogrepl.LSN, commit time.Time, err error) {
	if len(msg) < 26 {
		return 0, time.Time{}, errShortCommit
	}
	return pglogrepl.LSN(binary.BigEndian.Uint64(msg[10:18])), pgTime(msg[18:26]), nil
}

// pgTime reads a PostgreSQL timestamp (microseconds since its epoch).
func pgTime(b []byte) time.Time {
	return time.UnixMicro(int64(binary.BigEndian.Uint64(b)) + pgEpochMicros)
}
