// Package amqpconn opens AMQP connections with the whole handshake bounded by a
// context, for the RabbitMQ publisher and subscriber.
package amqpconn

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// closeTimeout bounds closing a connection that was opened too late.
const closeTimeout = 5 * time.Second

// Dial opens a connection to url named name (the connection_name client property
// that rabbitmqctl and the management UI show). ctx bounds the TCP dial, the TLS
// and the AMQP handshakes: amqp091-go has no context of its own, so the socket's
// deadline is set from ctx, and moved to now if ctx ends meanwhile. dial opens the
// socket (nil: a net.Dialer); tlsConfig, when set, is copied, since amqp091-go
// fills in its ServerName. If ctx ends just as the handshake completes, the
// connection is closed and ctx's error returned.
func Dial(ctx context.Context, url, name string, tlsConfig *tls.Config,
	dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*amqp.Connection, error) {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	var (
		mu   sync.Mutex
		conn net.Conn
	)
	props := amqp.NewConnectionProperties()
	props["connection_name"] = name
	cfg := amqp.Config{
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bounds the TLS and AMQP handshakes; amqp091-go clears it after.
			deadline, _ := ctx.Deadline()
			if err := c.SetDeadline(deadline); err != nil {
				c.Close()
				return nil, err
			}
			mu.Lock()
			conn = c
			mu.Unlock()
			return c, nil
		},
	}
	if tlsConfig != nil {
		cfg.TLSClientConfig = tlsConfig.Clone()
	}
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if conn != nil {
			_ = conn.SetDeadline(time.Now())
		}
	})
	c, err := amqp.DialConfig(url, cfg)
	if !stop() && err == nil {
		// ctx ended as the handshake completed: its deadline may be set.
		_ = c.CloseDeadline(time.Now().Add(closeTimeout))
		return nil, ctx.Err()
	}
	return c, err
}
