package mqtt_test

import (
	"context"
	"net"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/brokertest"
	"github.com/pgoutbox/pgoutbox/broker/mqtt"
	"github.com/pgoutbox/pgoutbox/wire"
)

// open returns a publisher to addr whose topics start with a prefix of the
// test's own, a subscriber already collecting them, and closes both at the
// end, removing their sessions from the broker.
func open(t *testing.T, addr string, cfg mqtt.Config) (*mqtt.Publisher, *subscriber) {
	t.Helper()
	prefix := unique("pgoutbox-test")
	var sub *subscriber
	if cfg.Version == mqtt.MQTT5 {
		sub = subscribe5(t, addr, prefix)
	} else {
		sub = subscribe(t, addr, prefix)
	}
	if cfg.ClientID == "" {
		cfg.ClientID = unique("pub")
	}
	if cfg.Topic.String() == "" {
		cfg.Topic = broker.MustParseTemplate(prefix + "/{aggregate_type}/{aggregate_id}/{event_type}")
	}
	p, err := mqtt.New("mqtt://"+addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Close()
		forgetSession(t, addr, cfg.ClientID)
	})
	return p, sub
}

func harness(version mqtt.Version, enc wire.Encoding) brokertest.Harness {
	return brokertest.Harness{
		Open: func(t *testing.T, opts brokertest.Options) *brokertest.Instance {
			// The shared Mosquitto keeps at most 1000 QoS 1 messages queued
			// for a subscriber that falls behind (max_queued_messages) plus 20
			// in flight: PerKeyOrder's 1000 fit, a larger batch would not.
			addr := sharedAddr
			var server *mosquitto
			cfg := mqtt.Config{Version: version, Encoding: enc}
			if opts.WrapConn != nil {
				server = startMosquitto(t)
				addr = server.addr
				cfg.DialContext = func(ctx context.Context, network, a string) (net.Conn, error) {
					var d net.Dialer
					c, err := d.DialContext(ctx, network, a)
					if err != nil {
						return nil, err
					}
					return opts.WrapConn(c), nil
				}
			}
			p, sub := open(t, addr, cfg)
			inst := &brokertest.Instance{Publisher: p, Read: sub.read}
			if server != nil {
				inst.Stop, inst.Start = server.Stop, server.Start
			}
			return inst
		},
		Invalid: func(m *broker.Message) { m.EventType = "bad+wildcard" },
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, harness(mqtt.MQTT311, wire.Encoding{}))
}

func TestConformanceMQTT5(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, harness(mqtt.MQTT5, wire.Encoding{}))
}
