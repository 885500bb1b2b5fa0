package rabbitmq_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/rabbitmq"
)

// sharedURL is the RabbitMQ server the test machine runs
// (PGOUTBOX_TEST_AMQP_URL overrides it). Other tests use it too: tests never
// stop it, and each works on an exchange and queue of its own, deleted when it
// ends.
var sharedURL = cmp.Or(os.Getenv("PGOUTBOX_TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")

var quiet = slog.New(slog.DiscardHandler)

func uniqueName(prefix string) string {
	var r [5]byte
	_, _ = rand.Read(r[:])
	return prefix + "-" + hex.EncodeToString(r[:])
}

// withHost returns sharedURL pointing at addr instead.
func withHost(t *testing.T, addr string) string {
	t.Helper()
	u, err := url.Parse(sharedURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

func sharedAddr(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(sharedURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// admin is the test's own connection to the shared server, to set up exchanges
// and queues and to read what was published.
type admin struct {
	t    *testing.T
	conn *amqp.Connection
	ch   *amqp.Channel
}

func newAdmin(t *testing.T) *admin {
	t.Helper()
	conn, err := amqp.Dial(sharedURL)
	if err != nil {
		t.Fatalf("connect to the shared RabbitMQ server: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return &admin{t: t, conn: conn, ch: ch}
}

// exchange declares an exchange of the test's own. It is auto-delete, so the
// server drops it with the last queue bound to it, and it is also deleted when
// the test ends.
func (a *admin) exchange(kind string) string {
	a.t.Helper()
	name := uniqueName("pgotest")
	if err := a.ch.ExchangeDeclare(name, kind, false, true, false, false, nil); err != nil {
		a.t.Fatalf("declare exchange: %v", err)
	}
	a.deleteExchangeAtEnd(name)
	return name
}

func (a *admin) deleteExchangeAtEnd(name string) {
	a.t.Cleanup(func() {
		// A channel of its own: a.ch may have been closed by a failed call.
		ch, err := a.conn.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		_ = ch.ExchangeDelete(name, false, false)
	})
}

// queue declares an exclusive queue, which the server deletes with the admin
// connection, bound to exchange with each of keys.
func (a *admin) queue(exchange string, keys ...string) string {
	a.t.Helper()
	q, err := a.ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		a.t.Fatalf("declare queue: %v", err)
	}
	for _, k := range keys {
		if err := a.ch.QueueBind(q.Name, k, exchange, false, nil); err != nil {
			a.t.Fatalf("bind queue: %v", err)
		}
	}
	return q.Name
}

// get returns every message in the queue, taking them off it.
func (a *admin) get(queue string) []amqp.Delivery {
	a.t.Helper()
	out, err := getAll(a.ch, queue)
	if err != nil {
		a.t.Fatalf("get from %s: %v", queue, err)
	}
	return out
}

// getOne takes the one message queue holds, and fails the test unless it holds
// exactly one.
func (a *admin) getOne(queue string) amqp.Delivery {
	a.t.Helper()
	got := a.get(queue)
	if len(got) != 1 {
		a.t.Fatalf("queue holds %d messages, want 1", len(got))
	}
	return got[0]
}

func getAll(ch *amqp.Channel, queue string) ([]amqp.Delivery, error) {
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			return nil, err
		}
		if !ok {
			return out, nil
		}
		out = append(out, d)
	}
}

// isolated returns a Config on an exchange of the test's own, and a queue bound
// to all of its routing keys.
func isolated(t *testing.T) (rabbitmq.Config, *admin, string) {
	t.Helper()
	a := newAdmin(t)
	ex := a.exchange(amqp.ExchangeTopic)
	q := a.queue(ex, "#")
	return rabbitmq.Config{
		Exchange:            ex,
		Logger:              quiet,
		ReconnectBackoff:    20 * time.Millisecond,
		MaxReconnectBackoff: 500 * time.Millisecond,
	}, a, q
}

func dial(t *testing.T, url string, cfg rabbitmq.Config) *rabbitmq.Publisher {
	t.Helper()
	p, err := rabbitmq.Dial(t.Context(), url, &cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func message(aggType, aggID string, seq int64) broker.Message {
	return brokertest.Message(aggType, aggID, seq)
}

func publish(t *testing.T, p broker.Publisher, msgs ...broker.Message) []error {
	t.Helper()
	return brokertest.Publish(t, p, msgs...)
}

// proxy forwards TCP connections to the shared server. Stop cuts every
// connection and stops listening, as a server that went down would; Start
// listens again on the same address. The server itself, shared with other
// tests, is never touched.
type proxy struct {
	upstream string
	addr     string

	mu      sync.Mutex
	ln      net.Listener
	conns   map[net.Conn]struct{}
	stopped bool
	wg      sync.WaitGroup
}

// newProxy reserves an address for a proxy to upstream; it does not listen
// until Start.
func newProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(brokertest.FreePort(t))
	p := &proxy{upstream: upstream, addr: addr, stopped: true}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	return p
}

func (p *proxy) Start(context.Context) error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ln, p.conns, p.stopped = ln, map[net.Conn]struct{}{}, false
	p.wg.Add(1)
	go p.accept(ln)
	return nil
}

func (p *proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

func (p *proxy) Stop(context.Context) error {
	p.mu.Lock()
	if !p.stopped {
		p.stopped = true
		p.ln.Close()
		for c := range p.conns {
			c.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// gate wraps a connection so that a test can hold its reads or its writes, and
// learn when one is held.
type gate struct {
	mu         sync.Mutex
	open       chan struct{} // closed while reads pass
	openW      chan struct{} // closed while writes pass
	heldWrites chan struct{} // gets a token when a write is held
}

func newGate() *gate {
	g := &gate{open: make(chan struct{}), openW: make(chan struct{}), heldWrites: make(chan struct{}, 1)}
	close(g.open)
	close(g.openW)
	return g
}

func (g *gate) holdReads()  { g.mu.Lock(); g.open = make(chan struct{}); g.mu.Unlock() }
func (g *gate) holdWrites() { g.mu.Lock(); g.openW = make(chan struct{}); g.mu.Unlock() }

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range []chan struct{}{g.open, g.openW} {
		select {
		case <-c:
		default:
			close(c)
		}
	}
}

func (g *gate) dialer(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return gatedConn{c, g}, nil
}

type gatedConn struct {
	net.Conn
	g *gate
}

// Read holds what it read, not the read itself: a read already waiting when
// the gate closes must not deliver.
func (c gatedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.g.mu.Lock()
	open := c.g.open
	c.g.mu.Unlock()
	<-open
	return n, err
}

func (c gatedConn) Write(b []byte) (int, error) {
	c.g.mu.Lock()
	open := c.g.openW
	c.g.mu.Unlock()
	select {
	case <-open:
	default:
		select {
		case c.g.heldWrites <- struct{}{}:
		default:
		}
		<-open
	}
	return c.Conn.Write(b)
}

// storedOf converts deliveries for the conformance suite.
func storedOf(ds []amqp.Delivery) []brokertest.Stored {
	out := make([]brokertest.Stored, 0, len(ds))
	for _, d := range ds {
		h := make(map[string]string, len(d.Headers))
		for k, v := range d.Headers {
			if s, ok := v.(string); ok {
				h[k] = s
			}
		}
		out = append(out, brokertest.Stored{Destination: d.RoutingKey, Key: d.RoutingKey, Headers: h, Body: d.Body})
	}
	return out
}

func isPredecessorFailed(err error) bool { return errors.Is(err, broker.ErrPredecessorFailed) }
