package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	paho5 "github.com/eclipse/paho.golang/paho"
	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/mqtt"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// mqttAddr is the shared Mosquitto of the test machine.
const mqttAddr = "127.0.0.1:1883"

// mqttSubscriber collects, parsed, every event under prefix/# through a
// persistent QoS 1 session opened before anything is published.
type mqttSubscriber struct {
	mu  sync.Mutex
	got []broker.Message
	bad []error
}

// add parses and keeps one message: its payload and, on MQTT 5, its
// properties.
func (s *mqttSubscriber) add(payload []byte, props *mqtt.Properties) {
	m, err := mqtt.ParseReceived(payload, props)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.bad = append(s.bad, err)
		return
	}
	s.got = append(s.got, m)
}

// mqtt5Subscribe subscribes to filter over MQTT 5 (paho.golang) as id, with
// a clean session, until the test ends, handing each message to add.
func mqtt5Subscribe(t *testing.T, id, filter string, add func([]byte, *mqtt.Properties)) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", mqttAddr, time.Minute)
	if err != nil {
		t.Fatalf("dial Mosquitto on %s: %v", mqttAddr, err)
	}
	c := paho5.NewClient(paho5.ClientConfig{ClientID: id, Conn: nc, OnPublishReceived: []func(paho5.PublishReceived) (bool, error){
		func(r paho5.PublishReceived) (bool, error) {
			props := &mqtt.Properties{}
			if pp := r.Packet.Properties; pp != nil {
				props.ContentType = pp.ContentType
				for _, u := range pp.User {
					props.User = append(props.User, mqtt.UserProperty{Key: u.Key, Value: u.Value})
				}
			}
			add(r.Packet.Payload, props)
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := c.Connect(ctx, &paho5.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatalf("connect to Mosquitto on %s as %s: %v", mqttAddr, id, err)
	}
	t.Cleanup(func() { _ = c.Disconnect(&paho5.Disconnect{}) })
	if _, err := c.Subscribe(ctx, &paho5.Subscribe{Subscriptions: []paho5.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
}

func (s *mqttSubscriber) messages() ([]broker.Message, []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]broker.Message(nil), s.got...), append([]error(nil), s.bad...)
}

func (s *mqttSubscriber) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := map[pgoutbox.UUID]bool{}
	for _, m := range s.got {
		ids[m.EventID] = true
	}
	return len(ids)
}

// mqttClient connects to the shared Mosquitto under id; clean: a clean
// session. It is disconnected when the test ends.
func mqttClient(t *testing.T, id string, clean bool, onMessage paho.MessageHandler) paho.Client {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + mqttAddr).SetClientID(id).
		SetProtocolVersion(4).SetCleanSession(clean).SetOrderMatters(true).SetDefaultPublishHandler(onMessage))
	if tok := c.Connect(); !tok.WaitTimeout(time.Minute) || tok.Error() != nil {
		t.Fatalf("connect to Mosquitto on %s as %s: %v", mqttAddr, id, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(250) })
	return c
}

// forgetMQTTSessions ends the persistent sessions of ids, so the test leaves
// nothing on the shared broker.
func forgetMQTTSessions(t *testing.T, ids ...string) {
	t.Cleanup(func() {
		for _, id := range ids {
			mqttClient(t, id, true, nil).Disconnect(250)
		}
	})
}

func uniqueMQTT(prefix string) string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// Acceptance: the binary relays to MQTT and is SIGKILLed mid-run; a second
// relay with the same client id (the same persistent session) finishes. A
// subscriber whose session was there from the start sees every event, each
// aggregate's first appearances in order.
func TestRelayMQTTSIGKILL(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"3.1.1", "5"} {
		t.Run("MQTT "+version, func(t *testing.T) {
			t.Parallel()
			relayMQTTSIGKILL(t, version)
		})
	}
}

func relayMQTTSIGKILL(t *testing.T, version string) {
	pool, schema := pgtest.Migrated(t, 8)
	e := &relayEnv{t: t, pool: pool, dbURL: pgtest.URL(), schema: schema}
	prefix, clientID, subID := uniqueMQTT("pgoutbox-relay-test"), uniqueMQTT("relay"), uniqueMQTT("sub")
	forgetMQTTSessions(t, clientID, subID)

	sub := &mqttSubscriber{}
	if version == "5" {
		mqtt5Subscribe(t, subID, prefix+"/#", func(payload []byte, props *mqtt.Properties) {
			if len(props.User) == 0 { // sent as MQTT 3.1.1 sends it
				sub.mu.Lock()
				sub.bad = append(sub.bad, fmt.Errorf("a message without user properties: %.100q", payload))
				sub.mu.Unlock()
				return
			}
			sub.add(payload, props)
		})
	} else {
		c := mqttClient(t, subID, false, func(_ paho.Client, msg paho.Message) { sub.add(msg.Payload(), nil) })
		if tok := c.Subscribe(prefix+"/#", 1, nil); !tok.WaitTimeout(time.Minute) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
	}

	// Fewer events than the shared Mosquitto queues for one client (its
	// max_queued_messages, 1000 by default): beyond that it drops QoS 1
	// messages for a subscriber that falls behind, as a loaded machine's may.
	ids := e.enqueue(40, 20)
	start := func(id string) *relayProc {
		return startRelayProc(t, "relay "+id, nil, []string{"relay", "--database-url", e.dbURL, "--schema", schema, "--id", id,
			"--broker", "mqtt://" + mqttAddr, "--mqtt-client-id", clientID, "--mqtt-version", version, "--batch-size", "50",
			"--topic-template", prefix + "/{aggregate_type}/{aggregate_id}", "--lease", "2s", "--publish-timeout", "1500ms"})
	}
	victim := start("victim")
	wait.For(t, time.Minute, "the victim to publish a tenth", func() bool { return e.count("published_at IS NOT NULL") >= len(ids)/10 })
	victim.kill(t)
	left := e.count("published_at IS NULL")

	successor := start("successor")
	wait.For(t, 2*time.Minute, "the successor to publish everything", func() bool { return e.count("published_at IS NULL") == 0 })
	successor.stopClean(t, "successor")
	if strings.Contains(successor.stderr.String(), "level=ERROR") {
		t.Errorf("successor logged errors:\n%s", successor.stderr.String())
	}
	wait.For(t, time.Minute, "the subscriber to receive every event", func() bool { return sub.distinct() >= len(ids) })
	got, bad := sub.messages()
	for _, err := range bad {
		t.Errorf("a message the subscriber could not parse: %v", err)
	}
	dups := brokertest.CheckStream(t, got, ids)
	t.Logf("%d events; %d left when the victim was killed; %d duplicates", len(ids), left, dups)
}

// The MQTT flags are checked at start-up, each mistake one line naming the
// flag, exit 2, the password never shown.
func TestRelayMQTTFlagErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	secret := filepath.Join(dir, "password")
	pgtest.Must(t, os.WriteFile(secret, []byte("hunter2\n"), 0o600), "password file")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--broker", "mqtt://127.0.0.1:1883"}, "--mqtt-client-id"},
		{[]string{"--broker", "mqtt://127.0.0.1:1883", "--mqtt-client-id", "r", "--mqtt-qos", "0"}, "--mqtt-qos 0: want 1 or 2"},
		{[]string{"--broker", "mqtt://127.0.0.1:1883", "--mqtt-client-id", "r", "--mqtt-version", "4"}, "--mqtt-version: mqtt: protocol version \"4\": want 3.1.1 or 5"},
		{[]string{"--broker", "mqtt://u:hunter2@127.0.0.1:1883", "--mqtt-client-id", "r"}, "carries a password"},
		{[]string{"--broker", "mqtt://127.0.0.1:1883", "--mqtt-client-id", "r", "--mqtt-password-file", secret}, "names no user"},
		{[]string{"--broker", "mqtt://u@127.0.0.1:1883", "--mqtt-client-id", "r", "--mqtt-password-file", dir + "/none"}, "--mqtt-password-file"},
		{[]string{"--broker", "mqtts://127.0.0.1:1883/path", "--mqtt-client-id", "r"}, "without path"},
	} {
		_, errOut, code := run(t, append([]string{"relay", "--database-url", "postgres://x@127.0.0.1:1/db"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "hunter2") {
			t.Errorf("relay %v: exit %d, stderr %q, want one line with %q", tc.args, code, errOut, tc.want)
		}
	}
}
