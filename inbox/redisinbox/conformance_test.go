package redisinbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/redisstream"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/inboxtest"
	"github.com/pgoutbox/pgoutbox/inbox/redisinbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const sharedAddr = "127.0.0.1:6379"

var quiet = slog.New(slog.DiscardHandler)

func unique(prefix string) string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// The subscriber conformance suite, on the shared Redis server.
func TestConformance(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, inboxtest.Harness{
		New: func(t *testing.T) inboxtest.Target { return newTarget(t) },
	})
}

// target is a stream of its own on the shared server, deleted at cleanup.
type target struct {
	stream string
	admin  *redis.Client
	pub    *redisstream.Publisher
	name   string // client name of the subscribers' connections
	copies atomic.Int64
}

func newTarget(t *testing.T) *target {
	t.Helper()
	s := &target{stream: unique("inboxtest"), name: unique("sub")}
	s.admin = redis.NewClient(&redis.Options{Addr: sharedAddr, DisableIdentity: true})
	pub, err := redisstream.Dial(t.Context(), "redis://"+sharedAddr, &redisstream.Config{
		Stream: broker.MustParseTemplate(s.stream), Logger: quiet})
	pgtest.Must(t, err, "dial")
	s.pub = pub
	t.Cleanup(func() {
		_ = pub.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.admin.Del(ctx, s.stream, redisstream.DefaultDedupKeyPrefix+s.stream).Err()
		_ = s.admin.Close()
	})
	return s
}

// Publish appends msgs in order; each publish is a copy of its own (a dedup
// id of its own), as a relay's re-publish beyond the dedup window would be.
func (s *target) Publish(t *testing.T, msgs ...broker.Message) {
	t.Helper()
	out := make([]broker.Message, len(msgs))
	for i, m := range msgs {
		m.DedupID = fmt.Sprintf("%s-%d", m.EventID, s.copies.Add(1))
		out[i] = m
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, err := range s.pub.Publish(ctx, out) {
		pgtest.Must(t, err, "publish %d", i)
	}
}

func (s *target) PublishRaw(t *testing.T, body []byte) {
	pgtest.Must(t, s.admin.XAdd(context.Background(), &redis.XAddArgs{Stream: s.stream, Values: []string{"body", string(body)}}).Err(), "XADD")
}

// CloseConnections has the server close every connection of the target's
// subscribers (CLIENT KILL by their name): the other tests' stay.
func (s *target) CloseConnections(t *testing.T) {
	list, err := s.admin.ClientList(context.Background()).Result()
	pgtest.Must(t, err, "CLIENT LIST")
	killed := 0
	for _, line := range strings.Split(list, "\n") {
		var id string
		mine := false
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(kv, "=")
			switch {
			case k == "id":
				id = v
			case k == "name" && v == s.name:
				mine = true
			}
		}
		if mine && id != "" {
			pgtest.Must(t, s.admin.Do(context.Background(), "CLIENT", "KILL", "ID", id).Err(), "CLIENT KILL")
			killed++
		}
	}
	if killed == 0 {
		t.Fatal("no subscriber connection to close")
	}
}

func (s *target) NewSubscriber(t *testing.T, proc inbox.Processor, k inboxtest.Knobs) inboxtest.Subscriber {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: sharedAddr, DisableIdentity: true, ClientName: s.name})
	t.Cleanup(func() { _ = c.Close() })
	sub, err := redisinbox.New(c, proc, &redisinbox.Config{Stream: s.stream, Concurrency: k.Concurrency,
		MinIdle: 5 * time.Second, ClaimInterval: 100 * time.Millisecond, Block: 200 * time.Millisecond, Logger: quiet})
	pgtest.Must(t, err, "redisinbox.New")
	return sub
}
