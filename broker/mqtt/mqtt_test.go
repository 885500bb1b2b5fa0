package mqtt_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/mqtt"
	"github.com/pgoutbox/pgoutbox/wire"
)

func TestCheckTopic(t *testing.T) {
	t.Parallel()
	if err := mqtt.CheckTopic("outbox/order/created"); err != nil {
		t.Errorf("valid topic: %v", err)
	}
	for name, topic := range map[string]string{
		"empty":     "",
		"plus":      "outbox/+/x",
		"hash":      "outbox/#",
		"nul":       "outbox/a\x00b",
		"not utf-8": "outbox/\xff",
		"reserved":  "$SYS/x",
		"too long":  strings.Repeat("a", mqtt.MaxTopicBytes+1),
	} {
		if err := mqtt.CheckTopic(topic); !broker.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent refusal", name, err)
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	ok := mqtt.Config{ClientID: "relay-1"}
	for name, c := range map[string]struct {
		url  string
		cfg  mqtt.Config
		want string
	}{
		"no client id":        {"mqtt://h", mqtt.Config{}, "--mqtt-client-id"},
		"password in URL":     {"mqtt://u:s3cret@h", ok, "PGOUTBOX_MQTT_PASSWORD"},
		"scheme":              {"tcp://h", ok, "want mqtt or mqtts"},
		"no host":             {"mqtt:///", ok, "no host"},
		"path":                {"mqtt://h/x", ok, "without path"},
		"port":                {"mqtt://h:99999", ok, "invalid port"},
		"QoS 3":               {"mqtt://h", mqtt.Config{ClientID: "c", QoS: 3}, "want 1 or 2"},
		"password, no user":   {"mqtt://h", mqtt.Config{ClientID: "c", Password: "s3cret"}, "names no user"},
		"payload above MQTT":  {"mqtt://h", mqtt.Config{ClientID: "c", MaxPayloadBytes: 1 << 30}, "MaxPayloadBytes"},
		"client id with NUL":  {"mqtt://h", mqtt.Config{ClientID: "a\x00"}, "client id"},
		"whitespace in a URL": {"mqtt://h /", ok, "whitespace"},
	} {
		_, err := mqtt.New(c.url, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error %q shows the password", name, err)
		}
	}
	for _, u := range []string{"mqtt://h", "mqtts://user@h:8884", "mqtt://[::1]:1883"} {
		if _, err := mqtt.New(u, ok); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
}

// TestUnreachable: a broker that is not there is unavailable, never a refusal.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	p, err := mqtt.New("mqtt://127.0.0.1:"+itoa(brokertest.FreePort(t)), mqtt.Config{ClientID: unique("pub")})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	brokertest.CheckUnreachable(t, p, brokertest.Message("order", "o1", 1), brokertest.Message("order", "o1", 2))
}

// TestRefusedBeforePublishing: a topic MQTT forbids and a payload above the
// maximum are refused permanently, and stop their aggregate's lane.
func TestRefusedBeforePublishing(t *testing.T) {
	t.Parallel()
	for _, version := range []mqtt.Version{mqtt.MQTT311, mqtt.MQTT5} {
		t.Run(version.String(), func(t *testing.T) {
			t.Parallel()
			p, sub := open(t, sharedAddr, mqtt.Config{Version: version, MaxPayloadBytes: 2048})
			big := brokertest.Message("order", "big", 1)
			big.Payload = []byte(`"` + strings.Repeat("x", 4096) + `"`)
			dollar := brokertest.Message("order", "d", 1)
			p2, _ := open(t, sharedAddr, mqtt.Config{Version: version, Topic: broker.MustParseTemplate("{aggregate_type}/{event_type}")})
			dollar.AggregateType = "$SYS"
			if err := brokertest.Publish(t, p2, dollar)[0]; !broker.IsPermanent(err) {
				t.Errorf("topic $SYS/...: %v, want a permanent refusal", err)
			}
			results := brokertest.Publish(t, p, big, brokertest.Message("order", "big", 2), brokertest.Message("order", "ok", 1))
			if !broker.IsPermanent(results[0]) || !errors.Is(results[1], broker.ErrPredecessorFailed) || results[2] != nil {
				t.Errorf("results %v, want permanent, ErrPredecessorFailed, nil", results)
			}
			got, err := sub.read(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Headers[wire.HeaderAggregateID] != "ok" {
				t.Errorf("stored %d messages (%v), want only aggregate ok's", len(got), got)
			}
		})
	}
}

// TestEnvelope publishes in both layouts of MQTT 3.1.1 and as MQTT 5 user
// properties, with a JSON and a binary payload, and reads each back with
// ParseReceived.
func TestEnvelope(t *testing.T) {
	t.Parallel()
	ce := wire.Encoding{Format: wire.FormatCloudEvents, CloudEventsSource: "/pgoutbox/app"}
	for _, c := range []struct {
		version mqtt.Version
		enc     wire.Encoding
	}{{mqtt.MQTT311, wire.Encoding{}}, {mqtt.MQTT311, ce}, {mqtt.MQTT5, wire.Encoding{}}} {
		t.Run(c.version.String()+"/"+c.enc.Format.String(), func(t *testing.T) {
			t.Parallel()
			p, sub := open(t, sharedAddr, mqtt.Config{Version: c.version, Encoding: c.enc, QoS: mqtt.ExactlyOnce})
			jsonMsg := brokertest.Message("order", "o1", 1)
			jsonMsg.Payload = []byte(`{ "spaced" : "caf\u00e9 <&>" }`)
			binMsg := brokertest.Message("order", "o1", 2)
			binMsg.ContentType = "application/octet-stream"
			binMsg.Payload = []byte{0, 1, 2, 0xff}
			for i, err := range brokertest.Publish(t, p, jsonMsg, binMsg) {
				if err != nil {
					t.Fatalf("result %d: %v", i, err)
				}
			}
			if err := sub.fence(t.Context()); err != nil {
				t.Fatal(err)
			}
			got := sub.messages()
			if len(got) != 2 {
				t.Fatalf("received %d messages, want 2", len(got))
			}
			if c.version == mqtt.MQTT5 {
				checkProperties(t, got, jsonMsg, binMsg)
			} else {
				var obj map[string]json.RawMessage
				if err := json.Unmarshal(got[0].payload, &obj); err != nil {
					t.Fatalf("payload is not a JSON object: %v", err)
				}
				if _, ce := obj["specversion"]; ce != (c.enc.Format == wire.FormatCloudEvents) {
					t.Errorf("specversion member present: %v, want it only in structured mode", ce)
				}
			}
			m, err := mqtt.ParseReceived(got[0].payload, got[0].props)
			if err != nil {
				t.Fatalf("ParseReceived: %v", err)
			}
			if m.EventID != jsonMsg.EventID || m.AggregateSequence != 1 || m.AggregateID != "o1" || m.EventType != "created" ||
				m.SchemaVersion != 2 || !m.OccurredAt.Equal(jsonMsg.OccurredAt) || !bytes.Equal(m.Payload, jsonMsg.Payload) ||
				m.Headers["Tenant"] != "acme corp" || m.Headers[wire.HeaderTraceParent] != jsonMsg.Headers[wire.HeaderTraceParent] {
				t.Errorf("parsed %+v, want %+v", m, jsonMsg)
			}
			// A binary payload travels base64-encoded in 3.1.1's envelope, as
			// it is on 5, and comes back exactly; ParseReceived, like the
			// inbox, accepts JSON only.
			d, err := mqtt.Decode(got[1].payload, got[1].props)
			if err != nil || !bytes.Equal(d.Body, binMsg.Payload) {
				t.Errorf("binary payload: %v %q", err, d.Body)
			}
			if _, err := mqtt.ParseReceived(got[1].payload, got[1].props); err == nil && c.enc.Format == wire.FormatCloudEvents {
				t.Error("ParseReceived accepted a CloudEvent whose datacontenttype is not JSON")
			}
		})
	}
}

func TestParseReceivedRefusesGarbage(t *testing.T) {
	t.Parallel()
	for _, p := range []string{``, `[]`, `{"data":1}`, `{"headers":{"Outbox-Event-Id":"x"},"data":1}`, `{"headers":1}`,
		`{"specversion":"1.0","id":"x"}`, `{"headers":{},"data_base64":"!"}`} {
		if _, err := mqtt.ParseReceived([]byte(p), nil); err == nil {
			t.Errorf("ParseReceived(%q) = nil error", p)
		}
	}
}

// TestRefusedCredentials: a CONNACK refusing the user name and password is a
// configuration error (retried, never quarantined), and shows no password, on
// either protocol version.
func TestRefusedCredentials(t *testing.T) {
	t.Parallel()
	server := startMosquitto(t, "allow_anonymous false", "password_file "+passwordFile(t, "relay", "right-password"))
	for _, c := range []struct {
		version        mqtt.Version
		user, password string
		ok             bool
	}{
		{mqtt.MQTT311, "relay", "wrong-password", false}, {mqtt.MQTT311, "relay", "right-password", true},
		{mqtt.MQTT5, "relay", "wrong-password", false}, {mqtt.MQTT5, "relay", "right-password", true},
	} {
		id := unique("pub")
		p, err := mqtt.New("mqtt://"+c.user+"@"+server.addr, mqtt.Config{Version: c.version, ClientID: id, Password: c.password})
		if err != nil {
			t.Fatal(err)
		}
		err = p.Ping(t.Context())
		results := brokertest.Publish(t, p, brokertest.Message("order", "o1", 1))
		_ = p.Close()
		switch {
		case c.ok && (err != nil || results[0] != nil):
			t.Errorf("MQTT %s, right password: ping %v, publish %v", c.version, err, results[0])
		case !c.ok && (!broker.IsMisconfigured(err) || !broker.IsMisconfigured(results[0])):
			t.Errorf("MQTT %s, wrong password: ping %v, publish %v, want misconfigured", c.version, err, results[0])
		case !c.ok && strings.Contains(err.Error(), c.password):
			t.Errorf("the error %q shows the password", err)
		}
	}
}

// FuzzParseReceived: whatever a subscriber receives, parsing never panics, and
// what it accepts encodes and parses back to the same event.
func FuzzParseReceived(f *testing.F) {
	m := brokertest.Message("order", "o1", 1)
	for _, enc := range []wire.Encoding{{}, {Format: wire.FormatCloudEvents}} {
		p, err := mqtt.Encode(enc, &m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Add([]byte(`{"headers":{},"data_base64":"AA=="}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		got, err := mqtt.ParseReceived(payload, nil)
		if err != nil {
			return
		}
		again, err := mqtt.Encode(wire.Encoding{}, &got)
		if err != nil {
			return // producer headers the codec refuses to send
		}
		back, err := mqtt.ParseReceived(again, nil)
		if err != nil || back.EventID != got.EventID || !bytes.Equal(back.Payload, got.Payload) {
			t.Fatalf("round trip of %q: %v", payload, err)
		}
	})
}
