package relay_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// recordMessage reads a Kafka record as a CloudEvents binding message in
// binary mode, as the CloudEvents Kafka protocol binding defines it: ce_
// headers are attributes or extensions, content-type is datacontenttype,
// the value is the data. The CloudEvents SDK does the rest: ToEvent
// checks the spec version, parses and validates every attribute.
type recordMessage struct {
	r       *kgo.Record
	version spec.Version
}

var kafkaBinding = spec.WithPrefix("ce_")

func newRecordMessage(r *kgo.Record) *recordMessage {
	m := &recordMessage{r: r}
	for _, h := range r.Headers {
		if h.Key == kafkaBinding.PrefixedSpecVersionName() {
			m.version = kafkaBinding.Version(string(h.Value))
		}
	}
	return m
}

func (m *recordMessage) ReadEncoding() binding.Encoding {
	if m.version == nil {
		return binding.EncodingUnknown
	}
	return binding.EncodingBinary
}

func (m *recordMessage) ReadStructured(context.Context, binding.StructuredWriter) error {
	return binding.ErrNotStructured
}

func (m *recordMessage) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for _, h := range m.r.Headers {
		switch {
		case strings.EqualFold(h.Key, "content-type"):
			if err := w.SetAttribute(m.version.AttributeFromKind(spec.DataContentType), string(h.Value)); err != nil {
				return err
			}
		case h.Key == kafkaBinding.PrefixedSpecVersionName():
		case m.version.Attribute(h.Key) != nil:
			if err := w.SetAttribute(m.version.Attribute(h.Key), string(h.Value)); err != nil {
				return err
			}
		case strings.HasPrefix(h.Key, "ce_"):
			if err := w.SetExtension(strings.TrimPrefix(h.Key, "ce_"), string(h.Value)); err != nil {
				return err
			}
		}
	}
	if len(m.r.Value) == 0 {
		return nil
	}
	return w.SetData(bytes.NewReader(m.r.Value))
}

func (m *recordMessage) Finish(error) error { return nil }

// GetAttribute and GetExtension make the message a
// binding.MessageMetadataReader, which the SDK's ToEvent asks for.
func (m *recordMessage) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	attr := m.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	name := attr.PrefixedName()
	if k == spec.DataContentType {
		name = "content-type"
	}
	for _, h := range m.r.Headers {
		if strings.EqualFold(h.Key, name) {
			return attr, string(h.Value)
		}
	}
	return attr, nil
}

func (m *recordMessage) GetExtension(name string) interface{} {
	for _, h := range m.r.Headers {
		if h.Key == "ce_"+name {
			return string(h.Value)
		}
	}
	return nil
}

// With the CloudEvents mapping on, a consumer that knows CloudEvents and not
// Ferry reads each record as a valid CloudEvent through the CloudEvents SDK:
// ce_id is the outbox id, type the event type, source the configured one,
// subject the aggregate, time the row's created_at, the data the payload
// byte for byte, and the content type the row's own or the configured
// default; a row header that is a ce_ extension passes through. Ferry's own
// headers stay, and a row whose headers use a name the mapping sets is
// quarantined instead of published with two values.
func TestCloudEventsConsumerReadsTheRecords(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.topic(t, "order", 2)
	cfg := b.cfg
	cfg.CloudEvents = &relay.CloudEvents{Source: "/shop/orders", ContentType: "application/json"}
	b.start(t, cfg)

	before := time.Now().Add(-time.Second)
	events := []outbox.Event{
		{AggregateType: "order", AggregateID: "o-1", EventType: "OrderPlaced", Payload: []byte(`{"total":42}`)},
		{AggregateType: "order", AggregateID: "o-2", EventType: "OrderShipped", Payload: []byte("<shipped/>"),
			Headers: map[string]string{"content-type": "application/xml", "ce_tenant": "acme"}},
		{AggregateType: "order", AggregateID: "o-3", EventType: "OrderNoted", Payload: nil},
	}
	ids := b.write(t, events...)
	clash := b.write(t, outbox.Event{AggregateType: "order", AggregateID: "o-4", EventType: "Forged", Payload: []byte("{}"),
		Headers: map[string]string{"ce_source": "/elsewhere"}})
	got := consume(t, []string{topic}, ids, time.Minute, time.Second)

	var createdAt = map[string]time.Time{}
	rows, err := b.db.Pool.Query(b.ctx, `SELECT id::text, created_at FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		createdAt[id] = at
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	byID := map[string]*event.Event{}
	for _, r := range got.records {
		e, err := binding.ToEvent(context.Background(), newRecordMessage(r))
		if err != nil {
			t.Fatalf("the CloudEvents SDK refused record %s: %v (headers %v)", header(r, outbox.HeaderID), err, r.Headers)
		}
		if err := e.Validate(); err != nil {
			t.Errorf("event %s is not a valid CloudEvent: %v", e.ID(), err)
		}
		if e.ID() != header(r, outbox.HeaderID) {
			t.Errorf("ce_id %q, Ferry's id header %q: want the same outbox id", e.ID(), header(r, outbox.HeaderID))
		}
		byID[e.ID()] = e
	}
	if _, ok := byID[clash[0]]; ok {
		t.Errorf("the row with its own ce_source header was published")
	}
	for i, ev := range events {
		e := byID[ids[i]]
		if e == nil {
			t.Fatalf("event %s (%s) did not arrive as a CloudEvent", ids[i], ev.EventType)
		}
		wantType := "application/json"
		if ct, ok := ev.Headers["content-type"]; ok {
			wantType = ct
		}
		if e.SpecVersion() != "1.0" || e.Type() != ev.EventType || e.Source() != "/shop/orders" || e.Subject() != ev.AggregateID ||
			e.DataContentType() != wantType {
			t.Errorf("event %s: specversion %q type %q source %q subject %q content type %q; want 1.0, %q, /shop/orders, %q, %q",
				e.ID(), e.SpecVersion(), e.Type(), e.Source(), e.Subject(), e.DataContentType(), ev.EventType, ev.AggregateID, wantType)
		}
		if !e.Time().Equal(createdAt[ids[i]]) || e.Time().Before(before) {
			t.Errorf("event %s: time %s, want the row's created_at %s", e.ID(), e.Time(), createdAt[ids[i]])
		}
		if !bytes.Equal(e.Data(), ev.Payload) {
			t.Errorf("event %s: data %q, want the payload %q", e.ID(), e.Data(), ev.Payload)
		}
	}
	if ext := byID[ids[1]].Extensions()["tenant"]; ext != "acme" {
		t.Errorf("the row's ce_tenant header became extension %v, want acme", ext)
	}
	q := waitQuarantined(t, b, 1)
	if q[0].ID.String() != clash[0] || q[0].Reason != relay.ReasonReservedHeader {
		t.Errorf("quarantined %+v, want %s as %s", q[0], clash[0], relay.ReasonReservedHeader)
	}
}
