package natsembed_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/broker/nats/natsembed"
)

func TestValidateNamesTheField(t *testing.T) {
	t.Parallel()
	var nilCfg *natsembed.Config
	if err := nilCfg.Validate(); err != nil {
		t.Errorf("nil Config: %v", err)
	}
	if err := (&natsembed.Config{Port: natsembed.RandomPort}).Validate(); err != nil {
		t.Errorf("RandomPort: %v", err)
	}
	err := (&natsembed.Config{Port: 70000, ReadyTimeout: -time.Second}).Validate()
	for _, field := range []string{"Config.Port", "Config.ReadyTimeout"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("error %v does not name %s", err, field)
		}
	}
	if _, err := natsembed.New(&natsembed.Config{Port: -2}); err == nil || !strings.Contains(err.Error(), "Config.Port") {
		t.Errorf("New with Port -2: %v", err)
	}
}

// A server without a StoreDir keeps its streams in a temporary directory that
// Shutdown removes; one with a StoreDir keeps them across a restart.
func TestStoreDir(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir()) // a temporary directory of this test's own
	before := tempDirs(t)
	srv, err := natsembed.New(&natsembed.Config{Port: natsembed.RandomPort})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	created := tempDirs(t)
	if len(before) != 0 || len(created) != 1 {
		t.Fatalf("temporary store directories: %d before, %d after New, want one more", len(before), len(created))
	}
	createStream(t, srv.URL(), "TMP")
	srv.Shutdown()
	srv.Shutdown() // twice is fine
	if after := tempDirs(t); len(after) != 0 {
		t.Errorf("Shutdown left the temporary store behind: %v", after)
	}

	dir := t.TempDir()
	first, err := natsembed.New(&natsembed.Config{StoreDir: dir, Port: natsembed.RandomPort})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	createStream(t, first.URL(), "KEPT")
	port := portOf(t, first.URL())
	first.Shutdown()
	second, err := natsembed.New(&natsembed.Config{StoreDir: dir, Port: port})
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	defer second.Shutdown()
	if _, err := jetStream(t, second.URL()).Stream(t.Context(), "KEPT"); err != nil {
		t.Errorf("stream after a restart on the same store: %v", err)
	}
}

func TestPortInUse(t *testing.T) {
	t.Parallel()
	srv, err := natsembed.New(&natsembed.Config{Port: natsembed.RandomPort})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer srv.Shutdown()
	again, err := natsembed.New(&natsembed.Config{Port: portOf(t, srv.URL()), ReadyTimeout: 2 * time.Second})
	if err == nil {
		again.Shutdown()
		t.Fatal("a second server on a port in use started")
	}
}

func tempDirs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "pgoutbox-natsembed-") {
			out = append(out, e.Name())
		}
	}
	return out
}

func jetStream(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := natsgo.Connect(url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func createStream(t *testing.T, url, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := jetStream(t, url).CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
}

func portOf(t *testing.T, url string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(url, "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(errors.Join(err, errors.New(url)))
	}
	return n
}
