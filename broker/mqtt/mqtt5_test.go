package mqtt_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/mqtt"
	"github.com/pgoutbox/pgoutbox/internal/logtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

func TestParseVersion(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]mqtt.Version{"3.1.1": mqtt.MQTT311, "5": mqtt.MQTT5} {
		if v, err := mqtt.ParseVersion(s); err != nil || v != want || v.String() != s {
			t.Errorf("ParseVersion(%q) = %v, %v", s, v, err)
		}
	}
	for _, s := range []string{"", "3", "4", "5.0", "3.1"} {
		if _, err := mqtt.ParseVersion(s); err == nil {
			t.Errorf("ParseVersion(%q) accepted", s)
		}
	}
	if _, err := mqtt.New("mqtt://h", mqtt.Config{ClientID: "c", Version: 3}); err == nil || !strings.Contains(err.Error(), "--mqtt-version") {
		t.Errorf("version 3: %v, want a refusal naming --mqtt-version", err)
	}
	// MQTT 5 sends a password without a user name.
	if _, err := mqtt.New("mqtt://h", mqtt.Config{ClientID: "c", Version: mqtt.MQTT5, Password: "p"}); err != nil {
		t.Errorf("MQTT 5, password without user: %v", err)
	}
}

// props returns the user properties as a map, failing on a repeated name.
func props(t *testing.T, p *mqtt.Properties) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, u := range p.User {
		if _, dup := m[u.Key]; dup {
			t.Errorf("user property %q repeated", u.Key)
		}
		m[u.Key] = u.Value
	}
	return m
}

// checkProperties checks what a v5 subscriber got for jsonMsg and binMsg
// (TestEnvelope): the payloads as they are, their media types in the Content
// Type, the headers as user properties.
func checkProperties(t *testing.T, got []received, jsonMsg, binMsg broker.Message) {
	t.Helper()
	if !bytes.Equal(got[0].payload, jsonMsg.Payload) || !bytes.Equal(got[1].payload, binMsg.Payload) {
		t.Errorf("payloads %q %q, want the exact bytes", got[0].payload, got[1].payload)
	}
	if got[0].props.ContentType != "application/json" || got[1].props.ContentType != "application/octet-stream" {
		t.Errorf("content types %q %q", got[0].props.ContentType, got[1].props.ContentType)
	}
	u := props(t, got[0].props)
	for k, want := range map[string]string{
		wire.HeaderEventID: jsonMsg.EventID.String(), wire.HeaderAggregateType: "order", wire.HeaderAggregateID: "o1",
		wire.HeaderAggregateSequence: "1", wire.HeaderEventType: "created", wire.HeaderSchemaVersion: "2",
		wire.HeaderTraceParent: jsonMsg.Headers[wire.HeaderTraceParent], "Tenant": "acme corp",
	} {
		if u[k] != want {
			t.Errorf("user property %s = %q, want %q", k, u[k], want)
		}
	}
}

// TestMQTT5CloudEventsBinary: the CloudEvents MQTT binding's binary mode for
// MQTT 5, attributes as user properties under their own names and
// datacontenttype as the Content Type, round trips through the broker.
func TestMQTT5CloudEventsBinary(t *testing.T) {
	t.Parallel()
	enc := wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/pgoutbox/app"}
	p, sub := open(t, sharedAddr, mqtt.Config{Version: mqtt.MQTT5, Encoding: enc})
	msg := brokertest.Message("order", "o1", 3)
	msg.Payload = []byte(`{"n": 1}`)
	msg.Headers["id"] = "a producer header named like an attribute"
	if err := brokertest.Publish(t, p, msg)[0]; err != nil {
		t.Fatal(err)
	}
	if err := sub.fence(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := sub.messages()
	if len(got) != 1 {
		t.Fatalf("received %d messages, want 1", len(got))
	}
	if !bytes.Equal(got[0].payload, msg.Payload) || got[0].props.ContentType != "application/json" {
		t.Errorf("payload %q, content type %q: want the payload as it is and the datacontenttype", got[0].payload, got[0].props.ContentType)
	}
	u := props(t, got[0].props)
	for k, want := range map[string]string{
		"specversion": "1.0", "id": msg.EventID.String(), "source": "/pgoutbox/app", "type": "created",
		"subject": "order/o1", "pgoutboxaggtype": "order", "pgoutboxaggid": "o1", "pgoutboxseq": "3",
		"pgoutboxschemaver": "2", wire.HeaderTraceParent: msg.Headers[wire.HeaderTraceParent],
	} {
		if u[k] != want {
			t.Errorf("user property %s = %q, want %q", k, u[k], want)
		}
	}
	for k := range u {
		if strings.HasPrefix(k, "ce") || strings.HasPrefix(k, "Outbox-") || k == "datacontenttype" {
			t.Errorf("user property %q: the binding has no prefix, no Outbox-* headers, datacontenttype is the Content Type", k)
		}
	}
	var producer map[string]string
	if err := json.Unmarshal([]byte(u["pgoutboxheaders"]), &producer); err != nil ||
		producer["Tenant"] != "acme corp" || producer["id"] != msg.Headers["id"] {
		t.Errorf("pgoutboxheaders %q (%v): want the producer's headers", u["pgoutboxheaders"], err)
	}
	m, err := mqtt.ParseReceived(got[0].payload, got[0].props)
	if err != nil {
		t.Fatalf("ParseReceived: %v", err)
	}
	if m.EventID != msg.EventID || m.AggregateSequence != 3 || m.SchemaVersion != 2 || !m.OccurredAt.Equal(msg.OccurredAt) ||
		m.Headers["Tenant"] != "acme corp" || m.Headers["id"] != msg.Headers["id"] ||
		m.Headers[wire.HeaderTraceParent] != msg.Headers[wire.HeaderTraceParent] || !bytes.Equal(m.Payload, msg.Payload) {
		t.Errorf("parsed %+v, want %+v", m, msg)
	}
}

// TestMQTT5HostileHeaders: header values MQTT 5 cannot carry are refused
// permanently before anything is sent, and what a subscriber receives is
// checked before it is believed.
func TestMQTT5HostileHeaders(t *testing.T) {
	t.Parallel()
	for name, v := range map[string]string{
		"over-long":     strings.Repeat("x", mqtt.MaxPropertyBytes+1),
		"control char":  "a\x01b",
		"NUL":           "a\x00b",
		"not UTF-8":     "a\xffb",
		"line break":    "a\r\nOutbox-Event-Id: x",
		"leading space": " x",
	} {
		m := brokertest.Message("order", "o1", 1)
		m.Headers["Evil"] = v
		for _, enc := range []wire.Encoding{{}, {Format: wire.FormatCloudEvents}} {
			if _, err := mqtt.Encode5(enc, &m); !wire.IsRefused(err) || !broker.IsPermanent(err) {
				t.Errorf("%s, %s: %v, want a permanent refusal", name, enc.Format, err)
			}
		}
	}
	m := brokertest.Message("order", "o1", 1)
	m.AggregateID = strings.Repeat("i", mqtt.MaxPropertyBytes+1)
	if _, err := mqtt.Encode5(wire.Encoding{}, &m); !broker.IsPermanent(err) {
		t.Errorf("over-long aggregate id: %v, want a permanent refusal", err)
	}

	good := brokertest.Message("order", "o1", 1)
	pr, err := mqtt.Encode5(wire.Encoding{}, &good)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mqtt.ParseReceived(good.Payload, &pr); err != nil {
		t.Fatalf("the good message: %v", err)
	}
	repeated := pr
	repeated.User = append(append([]mqtt.UserProperty(nil), pr.User...), mqtt.UserProperty{Key: wire.HeaderEventID, Value: pgoutboxEventID()})
	many := pr
	for range 200 {
		many.User = append(many.User, mqtt.UserProperty{Key: unique("k"), Value: "v"})
	}
	ce, err := mqtt.Encode5(wire.Encoding{Format: wire.FormatCloudEvents}, &good)
	if err != nil {
		t.Fatal(err)
	}
	badCE := ce
	badCE.User = append(append([]mqtt.UserProperty(nil), ce.User...), mqtt.UserProperty{Key: "pgoutboxheaders", Value: `{"ce-id":"x"}`})
	for name, p := range map[string]*mqtt.Properties{"repeated event id": &repeated, "too many": &many, "attribute posing as header": &badCE} {
		if _, err := mqtt.ParseReceived(good.Payload, p); !errors.Is(err, mqtt.ErrNotEnvelope) {
			t.Errorf("%s: %v, want ErrNotEnvelope", name, err)
		}
	}
	if _, err := mqtt.ParseReceived(good.Payload, &mqtt.Properties{User: []mqtt.UserProperty{{Key: "a", Value: "b"}}}); err == nil {
		t.Error("a message without the Outbox-* properties was accepted")
	}
}

func pgoutboxEventID() string { return brokertest.Message("x", "y", 1).EventID.String() }

// TestMQTT5ReasonCodes: a broker's refusal in the PUBACK (QoS 1) or PUBREC
// (QoS 2), which MQTT 3.1.1 cannot carry, fails the publish: an ACL denial as
// a configuration error, a payload above the broker's limit permanently; a
// packet above the broker's maximum is refused before sending.
func TestMQTT5ReasonCodes(t *testing.T) {
	t.Parallel()
	passwords, acl := passwordFile(t, "relay", "pw"), filepath.Join(t.TempDir(), "acl")
	if err := os.WriteFile(acl, []byte("user relay\ntopic readwrite allowed/#\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Mosquitto 2.0.11 closes the connection after a refused PUBLISH when
	// max_queued_messages is 0 (unlimited), racing the PUBACK it queued.
	server := startMosquitto(t, "allow_anonymous false", "password_file "+passwords, "acl_file "+acl,
		"message_size_limit 1000", "max_queued_messages 100")
	publish := func(topic string, qos mqtt.QoS, payload []byte) error {
		t.Helper()
		p, err := mqtt.New("mqtt://relay@"+server.addr, mqtt.Config{Version: mqtt.MQTT5, ClientID: unique("pub"), Password: "pw",
			QoS: qos, Topic: broker.MustParseTemplate(topic + "/{aggregate_type}")})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		m := brokertest.Message("order", "o1", 1)
		if payload != nil {
			m.Payload = payload
		}
		return brokertest.Publish(t, p, m)[0]
	}
	for _, qos := range []mqtt.QoS{mqtt.AtLeastOnce, mqtt.ExactlyOnce} {
		if err := publish("allowed", qos, nil); err != nil {
			t.Errorf("QoS %d, allowed topic: %v", qos, err)
		}
		err := publish("denied", qos, nil)
		t.Logf("QoS %d, denied: %v", qos, err)
		if !broker.IsMisconfigured(err) || !strings.Contains(err.Error(), "0x87 not authorized") {
			t.Errorf("QoS %d, denied topic: %v, want misconfigured, 0x87 not authorized", qos, err)
		}
		big := []byte(`"` + strings.Repeat("x", 2000) + `"`)
		if err := publish("allowed", qos, big); !broker.IsPermanent(err) || !strings.Contains(err.Error(), "the broker answered 0x") {
			t.Errorf("QoS %d, payload above message_size_limit: %v, want a permanent refusal with the broker's reason code", qos, err)
		}
	}

	limited := startMosquitto(t, "allow_anonymous true", "max_packet_size 2000")
	p, err := mqtt.New("mqtt://"+limited.addr, mqtt.Config{Version: mqtt.MQTT5, ClientID: unique("pub")})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	big := brokertest.Message("order", "o1", 1)
	big.Payload = []byte(`"` + strings.Repeat("x", 3000) + `"`)
	results := brokertest.Publish(t, p, big, brokertest.Message("order", "o2", 1))
	if !broker.IsPermanent(results[0]) || !strings.Contains(results[0].Error(), "maximum packet size") || results[1] != nil {
		t.Errorf("results %v, want a permanent refusal naming the broker's maximum packet size, then nil", results)
	}
}

// TestMQTT5Unreachable: a broker that is not there is unavailable.
func TestMQTT5Unreachable(t *testing.T) {
	t.Parallel()
	p, err := mqtt.New("mqtt://127.0.0.1:"+itoa(brokertest.FreePort(t)), mqtt.Config{Version: mqtt.MQTT5, ClientID: unique("pub")})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	brokertest.CheckUnreachable(t, p, brokertest.Message("order", "o1", 1), brokertest.Message("order", "o1", 2))
}

// FuzzParseReceived5: whatever MQTT 5 message a subscriber receives (user
// properties given as name=value lines), parsing never panics, and what it
// accepts encodes and parses back to the same event.
func FuzzParseReceived5(f *testing.F) {
	m := brokertest.Message("order", "o1", 1)
	for _, enc := range []wire.Encoding{{}, {Format: wire.FormatCloudEvents}} {
		p, err := mqtt.Encode5(enc, &m)
		if err != nil {
			f.Fatal(err)
		}
		var lines []string
		for _, u := range p.User {
			lines = append(lines, u.Key+"="+u.Value)
		}
		f.Add(m.Payload, p.ContentType, strings.Join(lines, "\n"))
	}
	f.Fuzz(func(t *testing.T, payload []byte, contentType, user string) {
		props := &mqtt.Properties{ContentType: contentType}
		for line := range strings.SplitSeq(user, "\n") {
			k, v, _ := strings.Cut(line, "=")
			props.User = append(props.User, mqtt.UserProperty{Key: k, Value: v})
		}
		got, err := mqtt.ParseReceived(payload, props)
		if err != nil {
			return
		}
		again, err := mqtt.Encode5(wire.Encoding{}, &got)
		if err != nil {
			return // producer headers the codec refuses to send
		}
		back, err := mqtt.ParseReceived(got.Payload, &again)
		if err != nil || back.EventID != got.EventID || !bytes.Equal(back.Payload, got.Payload) {
			t.Fatalf("round trip of %q %q: %v", payload, user, err)
		}
	})
}

// TestMQTT5ResumesSession: a Publisher's first connection starts clean, and
// after the connection is lost the next publish reconnects resuming the
// session (CleanStart false), which the broker still holds.
func TestMQTT5ResumesSession(t *testing.T) {
	t.Parallel()
	var d dialRecorder
	var logs logtest.Buffer
	p, sub := open(t, sharedAddr, mqtt.Config{Version: mqtt.MQTT5, Logger: logs.Logger(), DialContext: d.dial})
	publishAcrossLostConnection(t, p, &d, sub, func() {})
	out := logs.String()
	if !strings.Contains(out, "session_present=false") || !strings.Contains(out, "session_present=true") {
		t.Errorf("want a clean first connection, then the session resumed; log:\n%s", out)
	}
}

// TestMQTT311EndsLeftSession: a session a previous process left under the
// client id (CleanSession false) is ended before the Publisher's first
// persistent connection, which therefore finds none; a reconnect after a
// lost connection resumes the Publisher's own.
func TestMQTT311EndsLeftSession(t *testing.T) {
	t.Parallel()
	id := unique("pub")
	opts := paho.NewClientOptions().AddBroker("tcp://" + sharedAddr).SetClientID(id).
		SetCleanSession(false).SetProtocolVersion(4).SetConnectTimeout(10 * time.Second)
	left := paho.NewClient(opts)
	if tok := left.Connect(); !tok.WaitTimeout(deadline) || tok.Error() != nil {
		t.Fatalf("connect the previous process: %v", tok.Error())
	}
	left.Disconnect(250) // its session stays on the broker
	var d dialRecorder
	var logs logtest.Buffer
	p, sub := open(t, sharedAddr, mqtt.Config{ClientID: id, QoS: mqtt.ExactlyOnce, Logger: logs.Logger(), DialContext: d.dial})
	publishAcrossLostConnection(t, p, &d, sub, func() {
		if out := logs.String(); !strings.Contains(out, "ended the session left under the client id") ||
			!strings.Contains(out, "session_present=false") || strings.Contains(out, "session_present=true") {
			t.Fatalf("want the left session ended, then a persistent connection without it; log:\n%s", out)
		}
	})
	if out := logs.String(); !strings.Contains(out, "session_present=true") {
		t.Errorf("want the Publisher's own session resumed after the lost connection; log:\n%s", out)
	}
}

// dialRecorder dials as the Publisher would and keeps every connection, so
// that a test can lose one.
type dialRecorder struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (d *dialRecorder) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

// publishAcrossLostConnection publishes an event, calls connected, closes
// the newest connection, publishes a second event until the reconnect takes
// it, and checks that sub received both (a retried publish may arrive twice:
// MQTT keeps no ids).
func publishAcrossLostConnection(t *testing.T, p *mqtt.Publisher, d *dialRecorder, sub *subscriber, connected func()) {
	t.Helper()
	if err := brokertest.Publish(t, p, brokertest.Message("order", "o1", 1))[0]; err != nil {
		t.Fatal(err)
	}
	connected()
	d.mu.Lock()
	_ = d.conns[len(d.conns)-1].Close() // the connection is lost
	d.mu.Unlock()
	second := brokertest.Message("order", "o1", 2)
	wait.For(t, deadline, "a publish after the lost connection", func() bool {
		err := brokertest.Publish(t, p, second)[0]
		if err != nil && !broker.IsUnavailable(err) {
			t.Fatalf("after the lost connection: %v, want unavailable until reconnected", err)
		}
		return err == nil
	})
	got, err := sub.read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, s := range got {
		ids[s.Headers[wire.HeaderEventID]] = true
	}
	if !ids[second.EventID.String()] || len(ids) != 2 {
		t.Errorf("received events %v, want both", ids)
	}
}
