package rabbitinbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgoutbox/pgoutbox/internal/amqpconn"
)

// closeTimeout bounds the close handshake of a connection the Subscriber gives up
// on or shuts down.
const closeTimeout = 5 * time.Second

// session is one connection and the channel that consumes on it. It does not
// recover: when the connection, the channel or the consumer is lost, the
// Subscriber closes the connection (which hands every unacknowledged message back
// to the queue) and opens a new session.
type session struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery // nil until consuming

	connClosed <-chan *amqp.Error
	chClosed   <-chan *amqp.Error
	cancelled  <-chan string // the server cancelled the consumer (queue deleted)

	// lost is set once the deliveries channel closed while the Subscriber was not
	// stopping. Deliveries of a lost session are not processed any more: the
	// server redelivers them.
	lost atomic.Bool
}

// reason says why a session's deliveries stopped, as far as the client knows.
func (s *session) reason() error {
	for _, c := range []<-chan *amqp.Error{s.connClosed, s.chClosed} {
		select {
		case e, ok := <-c:
			if ok && e != nil {
				return e
			}
		default:
		}
	}
	select {
	case tag := <-s.cancelled:
		return fmt.Errorf("the server cancelled consumer %q (queue deleted?)", tag)
	default:
	}
	if s.conn.IsClosed() {
		return errors.New("connection closed")
	}
	return errors.New("channel closed")
}

func (s *session) close() {
	_ = s.conn.CloseDeadline(time.Now().Add(closeTimeout))
}

// open connects, declares the topology, and opens the consuming channel with its
// prefetch; with consume, it also starts the consumer. ctx and
// Config.ConnectTimeout bound it all.
func (s *Subscriber) open(ctx context.Context, consume bool) (*session, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	conn, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	var sess *session
	err = bounded(ctx, conn, func() error {
		if err := s.declare(conn); err != nil {
			return err
		}
		var err error
		if sess, err = s.channel(conn); err != nil {
			return err
		}
		if consume {
			return s.consume(sess)
		}
		return nil
	})
	if err != nil {
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		return nil, err
	}
	return sess, nil
}

// bounded runs fn, a sequence of channel calls on conn, and closes conn if ctx
// ends first: amqp091-go's calls cannot be cancelled, and closing the connection is
// what ends them.
func bounded(ctx context.Context, conn *amqp.Connection, fn func() error) error {
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(closed)
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
	})
	err := fn()
	if !stop() {
		<-closed
		return fmt.Errorf("rabbitinbox: %w", ctx.Err())
	}
	return err
}

// dial opens a connection named Config.ConnectionName, bounded by ctx.
func (s *Subscriber) dial(ctx context.Context) (*amqp.Connection, error) {
	c, err := amqpconn.Dial(ctx, s.url, s.cfg.ConnectionName, s.cfg.TLSConfig, nil)
	if err != nil {
		return nil, fmt.Errorf("rabbitinbox: connect to %s: %w", s.display, err)
	}
	return c, nil
}

// declare makes sure the queue exists and, when Config.Exchange is set, that the
// exchange exists and the queue is bound to it. Passive declares come first, so
// that an existing exchange or queue is used as it is, never redeclared with other
// settings (the server would refuse, closing the channel).
func (s *Subscriber) declare(conn *amqp.Connection) error {
	q, ex := s.cfg.Queue, s.cfg.Exchange
	queueExists := func() error {
		return withChannel(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
			return err
		})
	}
	if ex == "" {
		if err := queueExists(); err != nil {
			if isNotFound(err) {
				return fmt.Errorf("rabbitinbox: queue %q does not exist: declare it, or set Config.Exchange for the Subscriber to declare and bind it: %w", q, err)
			}
			return fmt.Errorf("rabbitinbox: check queue %q: %w", q, err)
		}
		return nil
	}

	err := withChannel(conn, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(ex, amqp.ExchangeTopic, true, false, false, false, nil)
	})
	if isNotFound(err) {
		// The relay declares it too, the same way; whichever comes first.
		err = withChannel(conn, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(ex, amqp.ExchangeTopic, true, false, false, false, nil)
		})
		if err == nil {
			s.log.Info("declared exchange", slog.String("exchange", ex), slog.String("type", amqp.ExchangeTopic))
		}
	}
	if err != nil {
		return fmt.Errorf("rabbitinbox: exchange %q: %w", ex, err)
	}

	err = queueExists()
	if isNotFound(err) {
		err = withChannel(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(q, true, false, false, false, s.cfg.QueueArguments)
			return err
		})
		if err == nil {
			s.log.Info("declared queue", slog.Bool("durable", true))
		}
	}
	if err != nil {
		return fmt.Errorf("rabbitinbox: queue %q: %w", q, err)
	}
	return withChannel(conn, func(ch *amqp.Channel) error {
		for _, key := range s.cfg.BindingKeys {
			if err := ch.QueueBind(q, key, ex, false, nil); err != nil {
				return fmt.Errorf("rabbitinbox: bind queue %q to exchange %q with key %q: %w", q, ex, key, err)
			}
		}
		return nil
	})
}

// channel opens the consuming channel on conn, with the prefetch window.
func (s *Subscriber) channel(conn *amqp.Connection) (*session, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitinbox: open channel: %w", err)
	}
	// Per consumer (global=false): the window of this Subscriber's consumer.
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("rabbitinbox: set prefetch: %w", err)
	}
	return &session{
		conn: conn,
		ch:   ch,
		// One notification each at most: with room for it, amqp091-go never
		// blocks on these channels.
		connClosed: conn.NotifyClose(make(chan *amqp.Error, 1)),
		chClosed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		cancelled:  ch.NotifyCancel(make(chan string, 1)),
	}, nil
}

// consume starts the consumer: manual acks, not exclusive, so that every instance
// of the inbox consumer shares the queue.
func (s *Subscriber) consume(sess *session) error {
	d, err := sess.ch.Consume(s.cfg.Queue, s.cfg.ConsumerTag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("rabbitinbox: consume from queue %q: %w", s.cfg.Queue, err)
	}
	sess.deliveries = d
	return nil
}

// withChannel runs fn on a channel of its own: a failed declare closes the channel
// it was made on.
func withChannel(conn *amqp.Connection, fn func(ch *amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	err = fn(ch)
	if !ch.IsClosed() {
		_ = ch.Close()
	}
	return err
}

func isNotFound(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound
}

// parseURL checks raw and returns it without its password, for logs and errors.
// amqp091-go would only find a mistake when it first dials; and net/url's errors
// quote the whole URL, password included, so only their cause is kept.
func parseURL(raw string) (display string, err error) {
	if strings.TrimSpace(raw) == "" {
		return "", errors.New("rabbitinbox: empty server URL")
	}
	if strings.IndexFunc(raw, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return "", errors.New("rabbitinbox: malformed server URL: it contains whitespace or a control character")
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // ue.URL holds the password
		}
		return "", fmt.Errorf("rabbitinbox: malformed server URL: %w", err)
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return "", fmt.Errorf("rabbitinbox: server URL: scheme %q, want amqp or amqps", u.Scheme)
	}
	if u.Opaque != "" || u.Hostname() == "" {
		return "", fmt.Errorf("rabbitinbox: server URL: no host, want %s://[user:password@]host[:port][/vhost]", u.Scheme)
	}
	d := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	if u.User != nil {
		d.User = url.User(u.User.Username())
	}
	display = d.String()
	// net/url accepted raw, so ParseURI's errors are about the port or a query
	// parameter, never the password.
	if _, err := amqp.ParseURI(raw); err != nil {
		return "", fmt.Errorf("rabbitinbox: server URL %s: %w", display, err)
	}
	return display, nil
}
