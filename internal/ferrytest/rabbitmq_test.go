package ferrytest

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func dialRabbitMQ(t *testing.T, rawURL string, tlsOn bool) *amqp.Connection {
	t.Helper()
	cfg := amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"}
	if tlsOn {
		cfg.TLSClientConfig = RabbitMQTLSConfig(t)
	}
	conn, err := amqp.DialConfig(rawURL, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", redact(rawURL), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "?"
	}
	return u.Redacted()
}

// authError: the node refused the login (403 ACCESS_REFUSED, or the socket
// closed during the handshake, which amqp091-go reports as ErrCredentials).
func authError(err error) bool {
	var ae *amqp.Error
	return errors.Is(err, amqp.ErrCredentials) || errors.As(err, &ae) && ae.Code == amqp.AccessRefused
}

// A quorum queue, a publish with a publisher confirm, the message got back:
// over the plain listener and over TLS with the stack's CA.
func TestRabbitMQPublishConfirmGet(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(testing.TB) string
		tls  bool
	}{
		{"plain", RabbitMQURL, false},
		{"tls", RabbitMQTLSURL, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := dialRabbitMQ(t, tc.url(t), tc.tls)
			if tc.tls && conn.ConnectionState().Version < 0x0303 {
				t.Fatalf("TLS version %#x, want 1.2 or later", conn.ConnectionState().Version)
			}
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			q := Name(t, "q")
			if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
				t.Fatalf("declare quorum queue: %v", err)
			}
			t.Cleanup(func() {
				c := dialRabbitMQ(t, RabbitMQURL(t), false)
				if ch, err := c.Channel(); err == nil {
					_, _ = ch.QueueDelete(q, false, false, false)
				}
			})
			info, err := RabbitMQManagement(t, "GET", "/api/queues/ferry/"+q, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(info), `"type":"quorum"`) {
				t.Fatalf("queue %s is not a quorum queue: %s", q, info)
			}
			if err := ch.Confirm(false); err != nil {
				t.Fatalf("confirm.select: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			body := "hello " + tc.name
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, ContentType: "text/plain", Body: []byte(body),
			})
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			acked, err := dc.WaitContext(ctx)
			if err != nil || !acked {
				t.Fatalf("publisher confirm: acked=%v err=%v", acked, err)
			}
			d, ok, err := ch.Get(q, true)
			if err != nil || !ok {
				t.Fatalf("basic.get: ok=%v err=%v", ok, err)
			}
			if string(d.Body) != body {
				t.Fatalf("got %q, want %q", d.Body, body)
			}
		})
	}
}

// A wrong password and the guest user are refused with an authentication
// error.
func TestRabbitMQRefusesBadLogins(t *testing.T) {
	good, err := url.Parse(RabbitMQURL(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, user := range []*url.Userinfo{
		url.UserPassword(good.User.Username(), "wrong-password"),
		url.UserPassword("guest", "guest"),
	} {
		u := *good
		u.User = user
		conn, err := amqp.Dial(u.String())
		if err == nil {
			_ = conn.Close()
			t.Fatalf("%s: logged in, want an authentication error", u.Redacted())
		}
		if !authError(err) {
			t.Fatalf("%s: %v (%T), want ACCESS_REFUSED or ErrCredentials", u.Redacted(), err, err)
		}
		t.Logf("%s: %v", u.Redacted(), err)
	}
}

// The relay's user publishes to outbox.* exchanges (after a passive declare)
// and to nothing else.
func TestRabbitMQRelayUser(t *testing.T) {
	admin := dialRabbitMQ(t, RabbitMQURL(t), false)
	ach, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ex := "outbox." + Suffix()
	if err := ach.ExchangeDeclare(ex, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ach.ExchangeDelete(ex, false, false) })

	relay := dialRabbitMQ(t, RabbitMQRelayURL(t), false)
	ch, err := relay.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclarePassive(ex, "topic", true, false, false, false, nil); err != nil {
		t.Fatalf("passive declare of %s: %v", ex, err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, ex, "k", false, false, amqp.Publishing{Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if acked, err := dc.WaitContext(ctx); err != nil || !acked {
		t.Fatalf("confirm on %s: acked=%v err=%v", ex, acked, err)
	}

	// Declaring is configuring: refused, and the channel is closed.
	err = ch.ExchangeDeclare("outbox.other."+Suffix(), "topic", true, false, false, false, nil)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
		t.Fatalf("relay declares an exchange: %v, want ACCESS_REFUSED", err)
	}
	ch2, err := relay.Channel()
	if err != nil {
		t.Fatal(err)
	}
	closed := ch2.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch2.PublishWithContext(ctx, "amq.topic", "k", false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		if e == nil || e.Code != amqp.AccessRefused {
			t.Fatalf("relay publishes to amq.topic: channel closed with %v, want ACCESS_REFUSED", e)
		}
	case <-ctx.Done():
		t.Fatal("relay published to amq.topic and the channel stayed open")
	}
}

func TestRabbitMQManagementAndCtl(t *testing.T) {
	b, err := RabbitMQManagement(t, "GET", "/api/whoami", nil)
	if err != nil {
		t.Fatal(err)
	}
	var who struct {
		Name string `json:"name"`
		Tags any    `json:"tags"`
	}
	if err := json.Unmarshal(b, &who); err != nil {
		t.Fatalf("whoami %s: %v", b, err)
	}
	if who.Name != "ferry" {
		t.Fatalf("whoami: %s", b)
	}
	b, err = RabbitMQManagement(t, "GET", "/api/users", nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"name":"guest"`) {
		t.Fatalf("the guest user exists: %s", b)
	}
	if _, err := RabbitMQManagement(t, "GET", "/api/vhosts/no-such-vhost", nil); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("GET of a missing vhost: %v, want a 404 error", err)
	}
	if out := RabbitMQCtl(t, "-q", "list_vhosts"); !strings.Contains(out, "ferry") {
		t.Fatalf("rabbitmqctl list_vhosts: %q", out)
	}
	if out := RabbitMQCtl(t, "eval", "node()."); !strings.Contains(out, strings.SplitN(needRabbitMQ(t, EnvRabbitMQNode), "@", 2)[0]) {
		t.Fatalf("rabbitmqctl eval node(): %q, want %s", out, needRabbitMQ(t, EnvRabbitMQNode))
	}
}
