package relay

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// row is one outbox insert as decoded from the WAL.
type row struct {
	ID            uuid.UUID
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       []byte
	Headers       []header // the row's own headers, sorted by key
	CreatedAt     time.Time
}

type header struct{ Key, Value string }

// outboxColumns are the columns the relay reads, by name: a column added to
// outbox later is ignored, and one that moved keeps working.
var outboxColumns = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at"}

// relation is a Relation message turned into column positions.
type relation struct {
	name   string // schema.table
	outbox bool
	index  [7]int // position of each outboxColumns entry
	oids   [7]uint32
}

// relations caches Relation messages. PostgreSQL sends one before the first
// change of a table on every connection, and again after the table's DDL.
type relations struct {
	byID map[uint32]*relation
	typs *pgtype.Map
}

func newRelations() *relations {
	return &relations{byID: make(map[uint32]*relation), typs: pgtype.NewMap()}
}

func (rs *relations) add(m *pglogrepl.RelationMessage) error {
	r := &relation{name: m.Namespace + "." + m.RelationName, outbox: m.RelationName == "outbox"}
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
	rs.byID[m.RelationID] = r
	return nil
}

// decode turns an Insert into a row. ok is false for tables other than
// outbox, which a publication may also carry.
func (rs *relations) decode(m *pglogrepl.InsertMessage) (ev row, ok bool, err error) {
	r := rs.byID[m.RelationID]
	if r == nil {
		return row{}, false, fmt.Errorf("insert into relation %d before its Relation message", m.RelationID)
	}
	if !r.outbox {
		return row{}, false, nil
	}
	cols := m.Tuple.Columns
	col := func(i int) (*pglogrepl.TupleDataColumn, error) {
		if r.index[i] >= len(cols) {
			return nil, fmt.Errorf("outbox insert has %d columns, column %q is number %d", len(cols), outboxColumns[i], r.index[i]+1)
		}
		c := cols[r.index[i]]
		if c.DataType == pglogrepl.TupleDataTypeNull && outboxColumns[i] != "headers" {
			return nil, fmt.Errorf("outbox column %q is NULL", outboxColumns[i])
		}
		return c, nil
	}
	for i, name := range outboxColumns {
		c, err := col(i)
		if err != nil {
			return row{}, true, err
		}
		if err := rs.decodeColumn(&ev, name, r.oids[i], c); err != nil {
			return row{}, true, fmt.Errorf("outbox column %q: %w", name, err)
		}
	}
	return ev, true, nil
}

func (rs *relations) decodeColumn(ev *row, name string, oid uint32, c *pglogrepl.TupleDataColumn) error {
	if c.DataType == pglogrepl.TupleDataTypeNull {
		return nil
	}
	binaryData := c.DataType == pglogrepl.TupleDataTypeBinary
	switch name {
	case "id":
		if binaryData && oid == pgtype.UUIDOID && len(c.Data) == 16 {
			copy(ev.ID[:], c.Data)
			return nil
		}
		id, err := uuid.ParseBytes(c.Data)
		ev.ID = id
		return err
	case "aggregate_type":
		ev.AggregateType = string(c.Data)
	case "aggregate_id":
		ev.AggregateID = string(c.Data)
	case "event_type":
		ev.EventType = string(c.Data)
	case "payload":
		if binaryData {
			ev.Payload = c.Data
			return nil
		}
		s, ok := strings.CutPrefix(string(c.Data), `\x`)
		if !ok {
			return fmt.Errorf("text bytea without \\x prefix")
		}
		b, err := hex.DecodeString(s)
		ev.Payload = b
		return err
	case "headers":
		data := c.Data
		if binaryData && oid == pgtype.JSONBOID {
			if len(data) == 0 || data[0] != 1 {
				return fmt.Errorf("unknown jsonb binary version")
			}
			data = data[1:]
		}
		return decodeHeaders(ev, data)
	case "created_at":
		if binaryData && oid == pgtype.TimestamptzOID && len(c.Data) == 8 {
			us := int64(binary.BigEndian.Uint64(c.Data))
			ev.CreatedAt = pgEpoch.Add(time.Duration(us) * time.Microsecond)
			return nil
		}
		var ts pgtype.Timestamptz
		format := int16(pgtype.TextFormatCode)
		if binaryData {
			format = pgtype.BinaryFormatCode
		}
		if err := rs.typs.Scan(oid, format, c.Data, &ts); err != nil {
			return err
		}
		ev.CreatedAt = ts.Time
	}
	return nil
}

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// decodeHeaders reads the headers object. Ferry's writer stores strings; a
// value of another JSON type, written by hand, travels as its JSON text.
func decodeHeaders(ev *row, data []byte) error {
	if len(data) <= 2 { // "{}"
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	ev.Headers = make([]header, 0, len(m))
	for k, raw := range m {
		v := string(raw)
		if len(raw) > 0 && raw[0] == '"' {
			if err := json.Unmarshal(raw, &v); err != nil {
				return err
			}
		}
		ev.Headers = append(ev.Headers, header{k, v})
	}
	slices.SortFunc(ev.Headers, func(a, b header) int { return strings.Compare(a.Key, b.Key) })
	return nil
}
