// Package null is a broker that acknowledges every message at once and keeps
// nothing: the ceiling of what the relay can do without a network, for benchmarks
// and for dry runs of a relay's database side ("--broker null://").
//
// Outside the standard library it pulls in only the root package's pgx and
// OpenTelemetry trace API.
package null

import (
	"context"
	"sync/atomic"

	"github.com/pgoutbox/pgoutbox/broker"
)

// Publisher acknowledges everything. The zero value is ready to use.
type Publisher struct {
	published atomic.Int64
}

var _ broker.Publisher = (*Publisher)(nil)

// Publish acknowledges every message, or fails them all with ctx's error when ctx
// has ended.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	if err := ctx.Err(); err != nil {
		return broker.FailAll(msgs, err)
	}
	p.published.Add(int64(len(msgs)))
	return make([]error, len(msgs))
}

// Published returns how many messages were acknowledged.
func (p *Publisher) Published() int64 { return p.published.Load() }

// Close does nothing.
func (p *Publisher) Close() error { return nil }
