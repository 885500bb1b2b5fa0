package natsinbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	natsgo "github.com/nats-io/nats.go"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/inboxtest"
	"github.com/pgoutbox/pgoutbox/inbox/natsinbox"
	"github.com/pgoutbox/pgoutbox/internal/natstest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The subscriber conformance suite, on the shared NATS JetStream server.
func TestConformance(t *testing.T) {
	t.Parallel()
	inboxtest.Run(t, inboxtest.Harness{
		New: func(t *testing.T) inboxtest.Target { return &suiteTarget{target: newStream(t)} },
		// The shared server cannot be restarted by a test: BrokerRestart runs on
		// one of its own.
		NewRestartable: newRestartTarget,
	})
}

// suiteTarget is a fresh stream for the suite.
type suiteTarget struct {
	target natstest.Target
	copies atomic.Int64 // each publish is a copy of its own (a new Nats-Msg-Id)
}

func (s *suiteTarget) Publish(t *testing.T, msgs ...broker.Message) {
	out := make([]published, len(msgs))
	for i, m := range msgs {
		out[i] = published{m, fmt.Sprintf("%s-%d", m.EventID, s.copies.Add(1))}
	}
	publishTo(t, s.target, out)
}

func (s *suiteTarget) PublishRaw(t *testing.T, body []byte) {
	_, err := s.target.JS.PublishMsg(context.Background(), &natsgo.Msg{Subject: s.target.Prefix + ".order.updated", Data: body})
	pgtest.Must(t, err, "publish")
}

func (s *suiteTarget) NewSubscriber(t *testing.T, proc inbox.Processor, k inboxtest.Knobs) inboxtest.Subscriber {
	t.Helper()
	sub, err := natsinbox.New(connect(t), proc, &natsinbox.Config{Stream: s.target.Stream, Concurrency: k.Concurrency, Logger: quiet})
	pgtest.Must(t, err, "natsinbox.New")
	return sub
}
