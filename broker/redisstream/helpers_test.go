package redisstream_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/redisstream"
	"github.com/pgoutbox/pgoutbox/internal/wait"
)

// sharedURL is the machine's Redis server, which the tests share: each uses
// streams of its own prefix and deletes them.
const sharedURL = "redis://127.0.0.1:6379"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// unique returns a fresh name prefix.
func unique(prefix string) string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// client returns a client of the server at addr, closed at cleanup.
func client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// isolated returns a config whose streams (and dedup sets) start with a prefix
// of the test's own, deleted at cleanup, and that prefix.
func isolated(t testing.TB, c *redis.Client) (*redisstream.Config, string) {
	t.Helper()
	prefix := unique("t")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, pattern := range []string{prefix + ".*", redisstream.DefaultDedupKeyPrefix + prefix + ".*"} {
			keys, _ := c.Keys(ctx, pattern).Result()
			if len(keys) > 0 {
				_ = c.Del(ctx, keys...).Err()
			}
		}
	})
	return &redisstream.Config{
		Stream: broker.MustParseTemplate(prefix + ".{aggregate_type}"),
		Logger: quiet,
	}, prefix
}

// dial opens a publisher, closed at cleanup.
func dial(t testing.TB, url string, cfg *redisstream.Config) *redisstream.Publisher {
	t.Helper()
	p, err := redisstream.Dial(t.Context(), url, cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// readStreams returns every entry of the streams whose keys start with
// prefix+".", each stream in its order.
func readStreams(ctx context.Context, c *redis.Client, prefix string) ([]brokertest.Stored, error) {
	keys, err := c.Keys(ctx, prefix+".*").Result()
	if err != nil {
		return nil, err
	}
	var out []brokertest.Stored
	for _, k := range keys {
		entries, err := c.XRange(ctx, k, "-", "+").Result()
		if err != nil {
			return nil, fmt.Errorf("XRANGE %s: %w", k, err)
		}
		for _, e := range entries {
			s := brokertest.Stored{Destination: k, Headers: map[string]string{}}
			for f, v := range e.Values {
				if f == "body" {
					s.Body = []byte(v.(string))
				} else {
					s.Headers[f] = v.(string)
				}
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// server is a redis-server of a test's own, with an append-only file so that
// its data survive a restart.
type server struct {
	t    testing.TB
	args []string // extra redis-server arguments
	dir  string
	port int
	mu   sync.Mutex
	cmd  *exec.Cmd // nil while stopped
}

func startServer(t testing.TB, args ...string) *server {
	t.Helper()
	s := &server{t: t, args: args, dir: t.TempDir(), port: brokertest.FreePort(t)}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.stop() })
	return s
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }
func (s *server) url() string  { return "redis://" + s.addr() }

func (s *server) start() error {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("redis-server not found (apt-get install redis-server): %w", err)
	}
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "yes", "--dir", s.dir, "--daemonize", "no"}, s.args...)
	cmd := exec.Command(path, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: s.addr(), DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	up := func() bool {
		err := c.Ping(context.Background()).Err()
		return err == nil || redis.HasErrorPrefix(err, "NOAUTH")
	}
	if !wait.Until(30*time.Second, up) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("redis-server on port %d did not answer within 30s:\n%s", s.port, out.String())
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	return nil
}

// stop shuts the server down cleanly (SIGTERM: the append-only file is
// flushed) and waits for it to exit.
func (s *server) stop() error {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return nil // killed by the signal: its own doing
	}
	return err
}

// wrapDialer dials TCP and wraps the connection.
func wrapDialer(wrap func(net.Conn) net.Conn) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrap(c), nil
	}
}
