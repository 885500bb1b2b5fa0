// Package sqs publishes outbox events to Amazon SQS FIFO queues ([New]) and
// SNS FIFO topics ([NewSNS]).
//
// Each event goes to the queue or topic that [Config.Destination] expands to
// (a queue name or URL; a topic ARN), with MessageGroupId the event's lane
// (aggregate type and id, hashed when they do not fit SQS's 128 characters:
// see groupID) and MessageDeduplicationId the event id, so a re-publish
// within SQS's five-minute window is dropped. A FIFO queue or topic delivers
// a group's messages in the order it stored them.
//
// # Wire format
//
// SQS and SNS allow 10 attributes per message, so the default format sends
// the seven Outbox-* headers as String attributes of the same names, the
// body's media type as [ContentTypeAttribute], and the producer's headers
// (traceparent among them) as one JSON object in [HeadersAttribute]; the body
// is the payload. [Headers] turns the attributes back into the headers
// wire.ParseReceived reads. AWS defines no CloudEvents binding for SQS, so the
// CloudEvents format sends a structured-mode JSON CloudEvent
// (application/cloudevents+json) as the body.
//
// A message is checked before it is sent: at most [MaxMessageBytes] with its
// attributes, and only characters SQS accepts; one that fails is refused as
// broker.Permanent with the reason.
//
// # Order
//
// Events go out in SendMessageBatch (PublishBatch) calls of up to 10 entries,
// one per queue, all calls of a round in flight together. A batch holds at
// most one event of each lane: SQS reports a result per entry, and when an
// entry fails the later entries of its group in the same call may still be
// stored, which would put an event before its predecessor. So an aggregate's
// next event is sent once the previous one is stored, and after a failure the
// rest of its lane get broker.ErrPredecessorFailed.
//
// # Errors
//
// Throttling, 5xx answers and network errors are broker.Unavailable; refused
// credentials or permissions (InvalidClientTokenId, SignatureDoesNotMatch,
// AccessDenied, …) and a queue or topic that does not exist are
// broker.Misconfigured; an entry refused for its content (invalid parameter,
// too long) is broker.Permanent.
//
// A standard (non-FIFO) queue or topic keeps no order: it is refused, when a
// destination is first used and at start for a destination without
// placeholders (unless the service cannot be reached then), unless
// [Config.AllowStandard] is set, and then a WARN says so and events go out
// without group and deduplication ids, which standard ones refuse.
//
// Credentials come from the client the caller passes, which the AWS default
// chain (environment, shared files, instance role) normally builds: the
// package never takes any itself.
//
// Outside the standard library it pulls in aws-sdk-go-v2 (its SQS and SNS
// clients) and smithy-go, besides the root package's pgx and OpenTelemetry
// trace API.
package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Defaults of Config.
const (
	// DefaultQueue is the queue template of New when Config.Destination is
	// unset.
	DefaultQueue = "outbox-{aggregate_type}.fifo"
	// DefaultTimeout bounds each call to SQS or SNS when Config.Timeout is
	// zero.
	DefaultTimeout = 30 * time.Second
)

// Config configures a Publisher. A nil *Config means all defaults.
type Config struct {
	// Destination expands to each event's queue (a name, or a queue URL
	// starting with https:// or http://) or topic (an ARN). Defaults to
	// DefaultQueue for New; NewSNS requires it.
	Destination broker.Template
	// AllowStandard accepts a standard (non-FIFO) queue or topic, with a WARN
	// that it does not keep order. Defaults to false: refused.
	AllowStandard bool
	// Timeout bounds each call. Defaults to DefaultTimeout.
	Timeout time.Duration
	// Logger receives the publisher's warnings. Defaults to slog.Default().
	Logger *slog.Logger
	// Encoding is the wire format. Defaults to the Outbox-* format.
	Encoding wire.Encoding
}

// ErrNotFIFO is wrapped by the error for a standard queue or topic when
// Config.AllowStandard is not set.
var ErrNotFIFO = errors.New("not FIFO")

// service is what SQS and SNS each do for the Publisher.
type service interface {
	// name is "SQS" or "SNS", for messages.
	name() string
	// resolve returns the address (queue URL, topic ARN) of destination and
	// whether it is FIFO.
	resolve(ctx context.Context, destination string) (address string, fifo bool, err error)
	// send sends entries to address in one call and returns one result per
	// entry, or an error for the whole call.
	send(ctx context.Context, address string, entries []entry) ([]error, error)
	// ping checks that the service answers with the publisher's credentials.
	ping(ctx context.Context) error
	// check returns why destination cannot name a queue or topic, or nil.
	check(destination string) error
}

// Publisher publishes to SQS or SNS. It is safe for concurrent use.
type Publisher struct {
	svc     service
	tmpl    broker.Template
	enc     wire.Encoding
	allow   bool
	timeout time.Duration
	log     *slog.Logger

	mu    sync.Mutex
	addrs map[string]target // by destination, once checked
}

func newPublisher(ctx context.Context, svc service, cfg *Config, defaultDest string) (*Publisher, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Destination.String() == "" {
		if defaultDest == "" {
			return nil, errors.New("sqs: " + svc.name() + ": Config.Destination is required (the topic ARN)")
		}
		c.Destination = broker.MustParseTemplate(defaultDest)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if err := c.Encoding.Validate(); err != nil {
		return nil, fmt.Errorf("sqs: Config.Encoding: %w", err)
	}
	p := &Publisher{svc: svc, tmpl: c.Destination, enc: c.Encoding, allow: c.AllowStandard,
		timeout: c.Timeout, log: c.Logger, addrs: map[string]target{}}
	if static := p.staticDestination(); static != "" {
		if err := svc.check(static); err != nil {
			return nil, fmt.Errorf("sqs: Config.Destination: %w", err)
		}
		if _, err := p.address(ctx, static); err != nil {
			if !broker.IsUnavailable(err) || broker.IsMisconfigured(err) {
				return nil, err
			}
			// Unreachable is not an error at start: publishes wait for it,
			// and check the destination when it answers.
			p.log.Warn("sqs: the destination could not be checked at start", slog.String("error", err.Error()))
		}
	}
	return p, nil
}

// staticDestination is the destination when the template has no placeholder.
func (p *Publisher) staticDestination() string {
	for _, f := range [...]string{"aggregate_type", "aggregate_id", "event_type", "schema_version", "tenant"} {
		if p.tmpl.Uses(f) {
			return ""
		}
	}
	return p.tmpl.String()
}

// target is a checked destination: its address (queue URL, topic ARN) and
// whether it is FIFO.
type target struct {
	addr string
	fifo bool
}

// address returns destination's target, resolving it and checking that it
// is FIFO the first time.
func (p *Publisher) address(ctx context.Context, destination string) (target, error) {
	p.mu.Lock()
	t, ok := p.addrs[destination]
	p.mu.Unlock()
	if ok {
		return t, nil
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	a, fifo, err := p.svc.resolve(cctx, destination)
	if err != nil {
		return target{}, err
	}
	if !fifo {
		if !p.allow {
			return target{}, broker.Misconfigured(fmt.Errorf("sqs: %s %q: %w, so it would not keep each aggregate's order "+
				"(use a .fifo one, or allow it with Config.AllowStandard)", p.svc.name(), destination, ErrNotFIFO))
		}
		p.log.Warn("sqs: publishing to a standard (non-FIFO) destination: the order of an aggregate's events is not kept",
			slog.String("service", p.svc.name()), slog.String("destination", destination))
	}
	t = target{a, fifo}
	p.mu.Lock()
	p.addrs[destination] = t
	p.mu.Unlock()
	return t, nil
}

// Ping checks that the service answers, and that a destination without
// placeholders still exists.
func (p *Publisher) Ping(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if static := p.staticDestination(); static != "" {
		_, _, err := p.svc.resolve(cctx, static)
		return err
	}
	return p.svc.ping(cctx)
}

// Close does nothing: the AWS client holds no connection of its own to close.
func (p *Publisher) Close() error { return nil }

// pending is one message of the current round: its index in msgs.
type pending struct {
	i int
	e entry
}

// Publish sends msgs and returns one result per message (broker.Publisher).
// Each round sends the first unsettled message of every lane; msgs holds each
// lane's messages in order, so a walk from the start finds them.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []error {
	results := make([]error, len(msgs))
	settled := make([]bool, len(msgs))
	failed := map[pgoutbox.Lane]bool{}
	for {
		byAddr := map[string][]pending{}
		var order []string
		inRound := map[pgoutbox.Lane]bool{}
		for i := range msgs {
			lane := msgs[i].Lane()
			if settled[i] || inRound[lane] {
				continue
			}
			settled[i] = failed[lane] // a failed lane's rest is settled at once
			if failed[lane] {
				results[i] = broker.ErrPredecessorFailed
				continue
			}
			inRound[lane] = true
			addr, e, err := p.prepare(ctx, &msgs[i])
			if err == nil {
				err = ctx.Err()
			}
			if err != nil {
				results[i], settled[i], failed[lane] = err, true, true
				continue
			}
			if _, ok := byAddr[addr]; !ok {
				order = append(order, addr)
			}
			byAddr[addr] = append(byAddr[addr], pending{i, e})
		}
		if len(order) == 0 {
			if len(inRound) == 0 {
				return results
			}
			continue // only failures this round: settle their lanes' rest
		}
		var calls [][]pending
		var addrs []string
		for _, a := range order {
			for _, c := range chunk(byAddr[a]) {
				calls = append(calls, c)
				addrs = append(addrs, a)
			}
		}
		var wg sync.WaitGroup
		errs := make([][]error, len(calls))
		for c := range calls {
			wg.Go(func() { errs[c] = p.call(ctx, addrs[c], calls[c]) })
		}
		wg.Wait()
		for c, call := range calls {
			for j, pd := range call {
				results[pd.i], settled[pd.i] = errs[c][j], true
				if errs[c][j] != nil {
					failed[msgs[pd.i].Lane()] = true
				}
			}
		}
	}
}

// prepare returns m's address and entry.
func (p *Publisher) prepare(ctx context.Context, m *broker.Message) (string, entry, error) {
	dest, err := p.tmpl.ExpandChecked(m)
	if err != nil {
		return "", entry{}, broker.Permanent(fmt.Errorf("sqs: event %s: %w", m.EventID, err))
	}
	if err := p.svc.check(dest); err != nil {
		return "", entry{}, broker.Permanent(fmt.Errorf("sqs: event %s: %w", m.EventID, err))
	}
	e, err := encode(p.enc, m)
	if err != nil {
		return "", entry{}, err
	}
	t, err := p.address(ctx, dest)
	if err != nil {
		return "", entry{}, err
	}
	if !t.fifo {
		// A standard queue or topic refuses group and deduplication ids.
		e.group, e.dedup = "", ""
	}
	return t.addr, e, nil
}

// chunk splits a round's entries for one address into calls of at most
// MaxBatchEntries entries and MaxMessageBytes.
func chunk(ps []pending) [][]pending {
	var out [][]pending
	var cur []pending
	size := 0
	for _, pd := range ps {
		n := pd.e.size()
		if len(cur) == MaxBatchEntries || (len(cur) > 0 && size+n > MaxMessageBytes) {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, pd)
		size += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// call sends one batch and returns one result per entry.
func (p *Publisher) call(ctx context.Context, addr string, ps []pending) []error {
	entries := make([]entry, len(ps))
	for i := range ps {
		entries[i] = ps[i].e
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	res, err := p.svc.send(cctx, addr, entries)
	if err == nil && len(res) != len(entries) {
		err = fmt.Errorf("sqs: %s answered %d results for %d entries", p.svc.name(), len(res), len(entries))
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = fmt.Errorf("%w (%w)", cerr, err)
		}
		res = make([]error, len(entries))
		for i := range res {
			res[i] = err
		}
	}
	return res
}

// batchIDs are the entry ids of a batch call: their position.
func batchID(i int) string { return strconv.Itoa(i) }

// isURL reports whether destination is a queue URL rather than a name.
func isURL(destination string) bool {
	return strings.HasPrefix(destination, "https://") || strings.HasPrefix(destination, "http://")
}
