package mqtt

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/eclipse/paho.golang/packets"
	paho5 "github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session/state"

	"github.com/pgoutbox/pgoutbox/broker"
)

// client5 is the MQTT 5 side of a Publisher: one paho.golang client per
// network connection, and one session state kept across them, so that a
// reconnect resends what the last connection left unacknowledged under the
// same packet identifiers, as the broker's copy of the session expects.
type client5 struct {
	session *state.State

	// Guarded by Publisher.mu.
	cli       *paho5.Client // the current connection's, or nil
	maxPacket uint32        // the broker's Maximum Packet Size, 0 for none
	connected bool          // a connection was accepted before
}

func newClient5() *client5 { return &client5{session: state.NewInMemory()} }

// noPacketTimeout is paho.golang's PacketTimeout: it bounds each wait for an
// acknowledgement (and connecting) by itself, and the Publisher bounds those
// waits with its own contexts, timers and connection watch instead.
const noPacketTimeout = time.Duration(math.MaxInt64)

// connect5 returns the open MQTT 5 connection, connecting first if there is
// none, within ctx and ConnectTimeout.
func (p *Publisher) connect5(ctx context.Context) (*paho5.Client, uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.v5
	if p.closed {
		return nil, 0, errors.New("mqtt: publisher closed")
	}
	if v.cli != nil {
		select {
		case <-v.cli.Done(): // its session state is saved once Done is closed
			v.cli = nil
			p.log.Warn("mqtt: connection lost; reconnecting")
		default:
			return v.cli, v.maxPacket, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConnectTimeout)
	defer cancel()
	nc, err := p.dialConn(ctx)
	if err != nil {
		return nil, 0, broker.Unavailable(fmt.Errorf("mqtt: connect to %s: %w", p.server.display, err))
	}
	cli := paho5.NewClient(paho5.ClientConfig{
		ClientID:      p.cfg.ClientID,
		Conn:          packets.NewThreadSafeConn(nc),
		Session:       v.session,
		PacketTimeout: noPacketTimeout,
		OnServerDisconnect: func(d *paho5.Disconnect) {
			reason := ""
			if d.Properties != nil {
				reason = d.Properties.ReasonString
			}
			p.log.Warn("mqtt: the broker closed the connection", "reason_code", fmt.Sprintf("0x%02X", d.ReasonCode),
				"reason", reasonName(d.ReasonCode), "broker_reason", fmt.Sprintf("%.200q", reason))
		},
	})
	expiry := uint32(p.cfg.SessionExpiry / time.Second)
	cp := &paho5.Connect{
		ClientID: p.cfg.ClientID,
		// The session state lives in this process: the first connection
		// starts clean, since a session a previous process left (a QoS 2
		// flow awaiting its PUBREL, say) cannot be resumed without it, and
		// its packet identifiers would make the broker drop new messages
		// as repeats. The later ones resume the session.
		CleanStart: !v.connected,
		KeepAlive:  uint16(p.cfg.KeepAlive / time.Second),
		Properties: &paho5.ConnectProperties{SessionExpiryInterval: &expiry, RequestProblemInfo: true},
	}
	if p.server.username != "" {
		cp.Username, cp.UsernameFlag = p.server.username, true
	}
	if p.cfg.Password != "" {
		cp.Password, cp.PasswordFlag = []byte(p.cfg.Password), true
	}
	ca, err := cli.Connect(ctx, cp)
	if err != nil {
		err = fmt.Errorf("mqtt: connect to %s: %w", p.server.display, err)
		if ca != nil && ca.ReasonCode >= 0x80 {
			return nil, 0, p.reasonError5(ca.ReasonCode, connackReason(ca), err, true)
		}
		return nil, 0, broker.Unavailable(err)
	}
	v.cli, v.connected, v.maxPacket = cli, true, 0
	if ca.Properties != nil && ca.Properties.MaximumPacketSize != nil {
		v.maxPacket = *ca.Properties.MaximumPacketSize
	}
	p.log.Info("mqtt: connected", "client_id", p.cfg.ClientID, "protocol", "MQTT 5", "session_present", ca.SessionPresent)
	return cli, v.maxPacket, nil
}

func connackReason(ca *paho5.Connack) string {
	if ca.Properties == nil {
		return ""
	}
	return ca.Properties.ReasonString
}

// send5 is send for MQTT 5.
func (p *Publisher) send5(ctx context.Context, m *broker.Message, topic string) (broker.AckFunc, error) {
	props, err := Encode5(p.cfg.Encoding, m)
	if err != nil {
		return nil, err
	}
	if n := len(m.Payload) + props.size(); n > p.cfg.MaxPayloadBytes {
		return nil, broker.Permanent(fmt.Errorf("mqtt: event %s refused: MQTT payload and properties of %d bytes, above the maximum of %d",
			m.EventID, n, p.cfg.MaxPayloadBytes))
	}
	cli, maxPacket, err := p.connect5(ctx)
	if err != nil {
		return nil, err
	}
	// Fixed header (at most 5 bytes), topic, packet identifier, properties
	// and payload.
	if n := 5 + 2 + len(topic) + 2 + props.size() + len(m.Payload); maxPacket > 0 && n > int(maxPacket) {
		return nil, broker.Permanent(fmt.Errorf("mqtt: event %s refused: a PUBLISH of %d bytes, above the broker's maximum packet size of %d",
			m.EventID, n, maxPacket))
	}
	user := make(paho5.UserProperties, len(props.User))
	for i, u := range props.User {
		user[i] = paho5.UserProperty{Key: u.Key, Value: u.Value}
	}
	pub := &paho5.Publish{
		QoS:        byte(p.cfg.QoS),
		Topic:      topic,
		Payload:    m.Payload, // the payload's exact bytes
		Properties: &paho5.PublishProperties{ContentType: props.ContentType, User: user},
	}
	type result struct {
		resp *paho5.PublishResponse
		err  error
	}
	res := make(chan result, 1)
	// Publish blocks until the acknowledgement (or until the broker's
	// Receive Maximum lets it send): waited for by the AckFunc, which ends
	// it when it returns. A message left unacknowledged stays in the
	// session, and a reconnect resends it.
	pctx, cancel := context.WithCancel(context.Background())
	go func() {
		r, err := cli.Publish(pctx, pub)
		res <- result{r, err}
	}()
	return func(ctx context.Context) error {
		defer cancel()
		timeout, stop := p.ackTimer()
		defer stop()
		select {
		case <-timeout:
			return p.noAck(m)
		case r := <-res:
			return p.publishError5(m, r.resp, r.err)
		case <-cli.Done():
			select {
			case r := <-res:
				return p.publishError5(m, r.resp, r.err)
			default:
			}
			return broker.Unavailable(fmt.Errorf("mqtt: event %s: the connection to %s ended before the broker acknowledged it", m.EventID, p.server.display))
		case <-ctx.Done():
			return fmt.Errorf("mqtt: event %s: waiting for the acknowledgement: %w", m.EventID, ctx.Err())
		}
	}, nil
}

// publishError5 classifies the outcome of one MQTT 5 publish. paho.golang
// returns a PUBACK's failure as an error, a PUBREC's (QoS 2) as a response
// without one: both are read from the reason code.
func (p *Publisher) publishError5(m *broker.Message, resp *paho5.PublishResponse, err error) error {
	if resp != nil && resp.ReasonCode >= 0x80 {
		reason := ""
		if resp.Properties != nil {
			reason = resp.Properties.ReasonString
		}
		return p.reasonError5(resp.ReasonCode, reason, fmt.Errorf("mqtt: publish event %s", m.EventID), false)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, paho5.ErrInvalidArguments):
		// QoS 2 asked of a broker that offers at most QoS 1: the only
		// argument the broker, not the event, decides.
		return broker.Misconfigured(fmt.Errorf("mqtt: publish event %s to %s: %w (see --mqtt-qos)", m.EventID, p.server.display, err))
	}
	return broker.Unavailable(fmt.Errorf("mqtt: publish event %s: %w", m.EventID, err))
}

// reasonError5 marks err with what an MQTT 5 failure reason code (0x80 and
// above, in a CONNACK, PUBACK or PUBREC) means for the relay: a refused
// permission or setting is a configuration error (retried, readiness
// failing); a refused topic, payload or packet size is permanent for a
// publish (the event is quarantined), a configuration error for a connect;
// the rest (unspecified, busy, quota exceeded, …) is the broker being
// unavailable. The broker's reason string is quoted and bounded.
func (p *Publisher) reasonError5(code byte, brokerReason string, err error, connect bool) error {
	err = fmt.Errorf("%w: the broker answered 0x%02X %s", err, code, reasonName(code))
	if brokerReason != "" {
		err = fmt.Errorf("%w (%.200q)", err, brokerReason)
	}
	switch code {
	case reasonNotAuthorized, reasonBadUserNameOrPassword, reasonUnsupportedProtocolVersion,
		reasonClientIDNotValid, reasonBanned, reasonBadAuthenticationMethod,
		reasonRetainNotSupported, reasonQoSNotSupported:
		return broker.Misconfigured(err)
	case reasonTopicNameInvalid, reasonPayloadFormatInvalid, reasonPacketTooLarge:
		if connect {
			return broker.Misconfigured(err)
		}
		return broker.Permanent(err)
	}
	return broker.Unavailable(err)
}

// MQTT 5 reason codes a broker may answer a CONNECT or PUBLISH with.
const (
	reasonUnspecifiedError           = 0x80
	reasonImplementationSpecific     = 0x83
	reasonUnsupportedProtocolVersion = 0x84
	reasonClientIDNotValid           = 0x85
	reasonBadUserNameOrPassword      = 0x86
	reasonNotAuthorized              = 0x87
	reasonServerUnavailable          = 0x88
	reasonServerBusy                 = 0x89
	reasonBanned                     = 0x8A
	reasonBadAuthenticationMethod    = 0x8C
	reasonTopicNameInvalid           = 0x90
	reasonPacketIDInUse              = 0x91
	reasonPacketTooLarge             = 0x95
	reasonQuotaExceeded              = 0x97
	reasonPayloadFormatInvalid       = 0x99
	reasonRetainNotSupported         = 0x9A
	reasonQoSNotSupported            = 0x9B
)

var reasonNames = map[byte]string{
	reasonUnspecifiedError:           "unspecified error",
	reasonImplementationSpecific:     "implementation specific error",
	reasonUnsupportedProtocolVersion: "unsupported protocol version",
	reasonClientIDNotValid:           "client identifier not valid",
	reasonBadUserNameOrPassword:      "bad user name or password",
	reasonNotAuthorized:              "not authorized",
	reasonServerUnavailable:          "server unavailable",
	reasonServerBusy:                 "server busy",
	reasonBanned:                     "banned",
	reasonBadAuthenticationMethod:    "bad authentication method",
	reasonTopicNameInvalid:           "topic name invalid",
	reasonPacketIDInUse:              "packet identifier in use",
	reasonPacketTooLarge:             "packet too large",
	reasonQuotaExceeded:              "quota exceeded",
	reasonPayloadFormatInvalid:       "payload format invalid",
	reasonRetainNotSupported:         "retain not supported",
	reasonQoSNotSupported:            "QoS not supported",
	0x8B:                             "server shutting down",
	0x8E:                             "session taken over",
	0x9C:                             "use another server",
	0x9D:                             "server moved",
	0x9F:                             "connection rate exceeded",
}

func reasonName(code byte) string {
	if n, ok := reasonNames[code]; ok {
		return n
	}
	if code < 0x80 {
		return "success"
	}
	return "failure"
}

// close5 disconnects the MQTT 5 connection, if any. Called with p.mu held.
func (p *Publisher) close5() {
	v := p.v5
	if v.cli != nil {
		// The next process starts clean (see connect5): nothing to keep.
		zero := uint32(0)
		_ = v.cli.Disconnect(&paho5.Disconnect{ReasonCode: 0, Properties: &paho5.DisconnectProperties{SessionExpiryInterval: &zero}})
		v.cli = nil
	}
	_ = v.session.Close()
}
