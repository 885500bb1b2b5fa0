package natsinbox_test

import (
	"testing"

	natsbroker "github.com/pgoutbox/pgoutbox/broker/nats"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/inbox/natsinbox"
	"github.com/pgoutbox/pgoutbox/internal/inboxtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/wire"
)

// TestCloudEventsFormat: the relay's NATS adapter publishes in the CloudEvents
// format (and once in the default format); the subscriber's consumer applies
// each event once, as with the default format.
func TestCloudEventsFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	publish := func(t *testing.T, enc wire.Encoding) broker.Publisher {
		t.Helper()
		p, err := natsbroker.New(t.Context(), connect(t), &natsbroker.Config{
			Stream: e.target.Stream, StreamSubjects: e.target.Subjects(),
			Subject: broker.MustParseTemplate(e.target.Template), Logger: quiet, Encoding: enc,
		})
		pgtest.Must(t, err, "nats publisher")
		return p
	}
	inboxtest.CloudEvents(t, e.Effects, publish, func(t *testing.T, proc inbox.Processor) {
		e.subscribe(t, connect(t), proc, natsinbox.Config{})
	})
}
