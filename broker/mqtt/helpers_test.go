package mqtt_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho5 "github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session/state"
	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/mqtt"
	"github.com/pgoutbox/pgoutbox/internal/systool"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// sharedAddr is the shared Mosquitto of the test machine.
const sharedAddr = "127.0.0.1:1883"

const deadline = 60 * time.Second

func unique(prefix string) string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// forgetSession removes the persistent session of clientID from the broker
// at addr: a clean-session connect and disconnect, so tests leave no trace.
func forgetSession(t testing.TB, addr, clientID string) {
	opts := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(clientID).
		SetCleanSession(true).SetProtocolVersion(4).SetConnectTimeout(10 * time.Second)
	c := paho.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(deadline) || tok.Error() != nil {
		t.Logf("forget session %s: %v", clientID, tok.Error())
		return
	}
	c.Disconnect(250)
}

// received is one message a subscriber got.
type received struct {
	topic   string
	payload []byte
	props   *mqtt.Properties // MQTT 5's, nil for 3.1.1
}

// subscriber collects every message under prefix/# (QoS 1, persistent
// session, reconnecting), from before the first publish to the end of the
// test.
type subscriber struct {
	publish func(topic, payload string) error // QoS 1, for the fence
	prefix  string
	mu      sync.Mutex
	got     []received
}

func subscribe(t testing.TB, addr, prefix string) *subscriber {
	t.Helper()
	s := &subscriber{prefix: prefix}
	id := unique("sub")
	var client paho.Client
	opts := paho.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetCleanSession(false).SetProtocolVersion(4).SetAutoReconnect(true).
		SetMaxReconnectInterval(time.Second).SetOrderMatters(true).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			s.mu.Lock()
			s.got = append(s.got, received{topic: m.Topic(), payload: append([]byte(nil), m.Payload()...)})
			s.mu.Unlock()
		})
	client = paho.NewClient(opts)
	if tok := client.Connect(); !tok.WaitTimeout(deadline) || tok.Error() != nil {
		t.Fatalf("subscriber connect to %s: %v", addr, tok.Error())
	}
	if tok := client.Subscribe(prefix+"/#", 1, nil); !tok.WaitTimeout(deadline) || tok.Error() != nil {
		t.Fatalf("subscribe %s/#: %v", prefix, tok.Error())
	}
	s.publish = func(topic, payload string) error {
		tok := client.Publish(topic, 1, false, payload)
		if !tok.WaitTimeout(5 * time.Second) {
			return errors.New("no PUBACK")
		}
		return tok.Error()
	}
	t.Cleanup(func() {
		client.Disconnect(250)
		forgetSession(t, addr, id)
	})
	return s
}

// subscribe5 is subscribe speaking MQTT 5 (with paho.golang), so that it
// sees the properties; it reconnects after a broker restart, resuming its
// session.
func subscribe5(t testing.TB, addr, prefix string) *subscriber {
	t.Helper()
	s := &subscriber{prefix: prefix}
	id := unique("sub5")
	session := state.NewInMemory()
	onPublish := func(r paho5.PublishReceived) (bool, error) {
		got := received{topic: r.Packet.Topic, payload: append([]byte(nil), r.Packet.Payload...), props: &mqtt.Properties{}}
		if pp := r.Packet.Properties; pp != nil {
			got.props.ContentType = pp.ContentType
			for _, u := range pp.User {
				got.props.User = append(got.props.User, mqtt.UserProperty{Key: u.Key, Value: u.Value})
			}
		}
		s.mu.Lock()
		s.got = append(s.got, got)
		s.mu.Unlock()
		return true, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu  sync.Mutex
		cur *paho5.Client
	)
	connect := func(clean bool) error {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		defer ccancel()
		nc, err := (&net.Dialer{}).DialContext(cctx, "tcp", addr)
		if err != nil {
			return err
		}
		c := paho5.NewClient(paho5.ClientConfig{ClientID: id, Conn: nc, Session: session,
			OnPublishReceived: []func(paho5.PublishReceived) (bool, error){onPublish}})
		expiry := uint32(3600)
		if _, err := c.Connect(cctx, &paho5.Connect{ClientID: id, CleanStart: clean, KeepAlive: 30,
			Properties: &paho5.ConnectProperties{SessionExpiryInterval: &expiry}}); err != nil {
			return err
		}
		mu.Lock()
		cur = c // the session is on this connection now
		mu.Unlock()
		if _, err := c.Subscribe(cctx, &paho5.Subscribe{Subscriptions: []paho5.SubscribeOptions{{Topic: prefix + "/#", QoS: 1}}}); err != nil {
			_ = c.Disconnect(&paho5.Disconnect{})
			return err
		}
		return nil
	}
	if err := connect(true); err != nil {
		cancel()
		t.Fatalf("subscriber connect to %s: %v", addr, err)
	}
	done := make(chan struct{})
	go func() { // reconnecting
		defer close(done)
		for {
			mu.Lock()
			c := cur
			mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-c.Done():
			}
			for connect(false) != nil {
				select {
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}()
	s.publish = func(topic, payload string) error {
		mu.Lock()
		c := cur
		mu.Unlock()
		select {
		case <-c.Done():
			return errors.New("reconnecting")
		default:
		}
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		defer pcancel()
		_, err := c.Publish(pctx, &paho5.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
		return err
	}
	t.Cleanup(func() {
		cancel()
		<-done
		mu.Lock()
		zero := uint32(0) // ends the session
		_ = cur.Disconnect(&paho5.Disconnect{Properties: &paho5.DisconnectProperties{SessionExpiryInterval: &zero}})
		mu.Unlock()
	})
	return s
}

// fence publishes a marker through the subscriber's own connection and waits
// until it comes back: Mosquitto queues a subscriber's messages in the order
// it accepted them, so every message acknowledged before has arrived by then.
func (s *subscriber) fence(ctx context.Context) error {
	marker := unique("fence")
	topic := s.prefix + "/fence/" + marker
	for {
		if s.publish(topic, marker) == nil {
			break
		}
		select { // reconnecting after a broker restart
		case <-ctx.Done():
			return fmt.Errorf("fence: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	for {
		s.mu.Lock()
		n := len(s.got)
		done := n > 0 && s.got[n-1].topic == topic
		for i := n - 1; i >= 0 && !done; i-- {
			done = s.got[i].topic == topic
		}
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fence: %d messages arrived, not the fence: %w", n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// messages returns what arrived so far, fences left out.
func (s *subscriber) messages() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []received
	for _, r := range s.got {
		if !strings.HasPrefix(r.topic, s.prefix+"/fence/") {
			out = append(out, r)
		}
	}
	return out
}

// read fences and returns the messages decoded as brokertest sees them.
func (s *subscriber) read(ctx context.Context) ([]brokertest.Stored, error) {
	if err := s.fence(ctx); err != nil {
		return nil, err
	}
	var out []brokertest.Stored
	for _, r := range s.messages() {
		d, err := mqtt.Decode(r.payload, r.props)
		if err != nil {
			return nil, fmt.Errorf("message on %s: %w", r.topic, err)
		}
		out = append(out, brokertest.Stored{Destination: r.topic, Headers: d.Headers, Body: d.Body})
	}
	return out, nil
}

// passwordFile writes a Mosquitto password file with one user, and returns
// its path.
func passwordFile(t testing.TB, user, password string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "passwords")
	bin := systool.Need(t, systool.Tool{Program: "mosquitto_passwd", Package: "mosquitto"})
	if out, err := exec.Command(bin, "-b", "-c", path, user, password).CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
	}
	if err := os.Chmod(path, 0o644); err != nil { // read by Mosquitto's user
		t.Fatal(err)
	}
	return path
}

// mosquitto is a Mosquitto of the test's own, with persistence, for tests that
// stop and start it.
type mosquitto struct {
	t    testing.TB
	bin  string
	conf string
	addr string
	cmd  *exec.Cmd
	exit chan struct{}
}

// startMosquitto starts one; extra lines replace allow_anonymous true, and
// come last, so that they override the settings before them.
func startMosquitto(t testing.TB, extra ...string) *mosquitto {
	t.Helper()
	bin := systool.Need(t, systool.Tool{Program: "mosquitto", Package: "mosquitto"})
	dir := t.TempDir()
	port := brokertest.FreePort(t)
	conf := filepath.Join(dir, "mosquitto.conf")
	access := "allow_anonymous true\n"
	if len(extra) > 0 {
		access = strings.Join(extra, "\n") + "\n"
	}
	text := fmt.Sprintf("listener %d 127.0.0.1\npersistence true\npersistence_location %s/\n"+
		"max_queued_messages 0\nmax_inflight_messages 0\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\nlog_type information\nlog_type subscribe\n%s", port, dir, access)
	if os.Geteuid() == 0 {
		text += "user root\n" // else it drops to user mosquitto, who cannot write dir
	}
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	m := &mosquitto{t: t, bin: bin, conf: conf, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.Stop(context.Background())
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			t.Logf("mosquitto log:\n%s", log)
		}
	})
	return m
}

// Start starts the server and waits until it listens.
func (m *mosquitto) Start(context.Context) error {
	m.cmd = exec.Command(m.bin, "-c", m.conf)
	logf, err := os.OpenFile(filepath.Join(filepath.Dir(m.conf), "log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	m.cmd.Stderr = logf
	if err := m.cmd.Start(); err != nil {
		return fmt.Errorf("start mosquitto: %w", err)
	}
	m.exit = make(chan struct{})
	go func(cmd *exec.Cmd, exit chan struct{}) { _ = cmd.Wait(); close(exit) }(m.cmd, m.exit)
	wait.For(m.t, deadline, "mosquitto listening on "+m.addr, func() bool {
		c, err := net.DialTimeout("tcp", m.addr, 5*time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return nil
}

// Stop stops the server gracefully, so that it saves its sessions.
func (m *mosquitto) Stop(ctx context.Context) error {
	if m.cmd == nil {
		return nil
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exit:
	case <-ctx.Done():
		_ = m.cmd.Process.Kill()
		<-m.exit
	}
	m.cmd = nil
	return nil
}

func itoa(n int) string { return fmt.Sprint(n) }
