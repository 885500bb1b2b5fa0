package redisinbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/redisstream"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/redisinbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/wait"
	"github.com/pgoutbox/pgoutbox/wire"
)

// start starts a subscriber of s's stream for proc, stopped when the test ends.
func (s *target) start(t *testing.T, proc inbox.Processor, cfg redisinbox.Config) *redisinbox.Subscriber {
	t.Helper()
	cfg.Stream = s.stream
	cfg.Logger = quiet
	c := redis.NewClient(&redis.Options{Addr: sharedAddr, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	sub, err := redisinbox.New(c, proc, &cfg)
	pgtest.Must(t, err, "redisinbox.New")
	pgtest.Must(t, sub.Start(context.Background()), "Start")
	inboxtest.StopAtEnd(t, sub)
	return sub
}

func newEffects(t *testing.T) *inboxtest.Effects {
	pool, schema := pgtest.Migrated(t, 8)
	return inboxtest.NewEffects(t, pool, schema)
}

// A consumer of the group that read entries and died: once they are idle for
// MinIdle, a live subscriber claims and applies them, in order.
func TestDeadConsumerReclaimed(t *testing.T) {
	t.Parallel()
	e := newEffects(t)
	s := newTarget(t)
	c := e.Consumer(t, inbox.Config{}, nil)
	lane := inboxtest.Lane("r0", 5)
	s.Publish(t, lane...)
	ctx := context.Background()
	pgtest.Must(t, s.admin.XGroupCreate(ctx, s.stream, c.Name(), "0").Err(), "XGROUP CREATE")
	read, err := s.admin.XReadGroup(ctx, &redis.XReadGroupArgs{Group: c.Name(), Consumer: "dead",
		Streams: []string{s.stream, ">"}, Count: 100}).Result()
	pgtest.Must(t, err, "XREADGROUP")
	if n := len(read[0].Messages); n != 5 {
		t.Fatalf("the dead consumer read %d entries, want 5", n)
	}
	sub := s.start(t, c, redisinbox.Config{MinIdle: 300 * time.Millisecond, ClaimInterval: 50 * time.Millisecond})
	wait.For(t, time.Minute, "the dead consumer's entries to be applied", func() bool { return e.Count(t, "effects", "true") == 5 })
	e.CheckInOrder(t, "r%d", 1, 5)
	if st := sub.Stats(); st.Claimed < 5 || st.Acked < 5 {
		t.Errorf("stats %+v: want 5 claimed and acked", st)
	}
	wait.For(t, time.Minute, "nothing pending", func() bool {
		pending, err := s.admin.XPending(ctx, s.stream, c.Name()).Result()
		return err == nil && pending.Count == 0
	})
}

// The CloudEvents case, fed by the redisstream publisher.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	e := newEffects(t)
	s := newTarget(t)
	publish := func(t *testing.T, enc wire.Encoding) broker.Publisher {
		// A dedup set of each publisher's own: the case's re-publish must be
		// stored again, as after the dedup window.
		prefix := unique("cetest") + ":"
		t.Cleanup(func() { _ = s.admin.Del(context.Background(), prefix+s.stream).Err() })
		p, err := redisstream.Dial(t.Context(), "redis://"+sharedAddr, &redisstream.Config{
			Stream: broker.MustParseTemplate(s.stream), Encoding: enc, Logger: quiet, DedupKeyPrefix: prefix})
		pgtest.Must(t, err, "dial")
		return p
	}
	inboxtest.CloudEvents(t, e, publish, func(t *testing.T, proc inbox.Processor) {
		s.start(t, proc, redisinbox.Config{})
	})
}
