package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/mqtt"
)

// mqttPasswordEnv is the variable the MQTT password is read from when
// --mqtt-password-file is not given.
const mqttPasswordEnv = "PGOUTBOX_MQTT_PASSWORD"

// mqttClientIDPerRelay gives each relay of a bench a client id of its own:
// two relays under one id would take each other's session over, again and
// again. A PGOUTBOX_MQTT_CLIENT_ID the bench was given prefixes them.
func mqttClientIDPerRelay(id string) []string {
	if base := os.Getenv("PGOUTBOX_MQTT_CLIENT_ID"); base != "" {
		id = base + "-" + id
	}
	return []string{"PGOUTBOX_MQTT_CLIENT_ID=" + id}
}

// mqttFlags are the flags of MQTT, and the password parse read.
type mqttFlags struct {
	clientID     string
	qos          int
	version      string
	passwordFile string
	password     string       // read by parse
	protocol     mqtt.Version // version, parsed
}

func registerMQTTFlags(fs *pflag.FlagSet) any {
	o := &mqttFlags{}
	fs.StringVar(&o.clientID, "mqtt-client-id", "", "MQTT client id, required and stable: the broker keeps the relay's persistent session under it; one per relay process (env PGOUTBOX_MQTT_CLIENT_ID)")
	fs.IntVar(&o.qos, "mqtt-qos", 1, "MQTT QoS of the events: 1 (at least once) or 2 (exactly once between relay and broker); 0 is refused, as it can lose events (env PGOUTBOX_MQTT_QOS)")
	fs.StringVar(&o.version, "mqtt-version", "3.1.1", "MQTT protocol version: 3.1.1 (the outbox fields in a JSON envelope in the payload) or 5 (the headers as user properties, the payload as it is, a broker's refusal such as an ACL denial detected) (env PGOUTBOX_MQTT_VERSION)")
	fs.StringVar(&o.passwordFile, "mqtt-password-file", "", "file holding the MQTT password; else "+mqttPasswordEnv+" is used (env PGOUTBOX_MQTT_PASSWORD_FILE)")
	return o
}

// parseMQTT checks the URL and the MQTT flags and reads the password,
// without connecting.
func parseMQTT(t *brokerTarget, o *mqttFlags) error {
	if o.qos != 1 && o.qos != 2 {
		return usagef("--mqtt-qos %d: want 1 or 2 (QoS 0 is not acknowledged, so an event could be lost)", o.qos)
	}
	v, err := mqtt.ParseVersion(o.version)
	if err != nil {
		return usagef("--mqtt-version: %v", err)
	}
	o.protocol = v
	switch {
	case o.passwordFile != "":
		var err error
		if o.password, err = readSecretFile("--mqtt-password-file", o.passwordFile); err != nil {
			return err
		}
	default:
		o.password = os.Getenv(mqttPasswordEnv)
	}
	if _, err := mqtt.New(t.flags.url, mqttConfig(t, o, nil)); err != nil {
		return usagef("--broker: %v", err)
	}
	return nil
}

func mqttConfig(t *brokerTarget, o *mqttFlags, log *slog.Logger) mqtt.Config {
	cfg := mqtt.Config{Version: o.protocol, ClientID: o.clientID, Password: o.password, QoS: mqtt.QoS(o.qos),
		AckTimeout: t.flags.ackTimeout, Logger: log, Encoding: t.encoding}
	if t.template != nil {
		cfg.Topic = *t.template
	}
	return cfg
}

// openMQTT makes the MQTT publisher and connects, so that a broker refusing
// the credentials or the client id stops the command at start-up; a broker
// that cannot be reached is waited for by the publishes.
func openMQTT(ctx context.Context, t *brokerTarget, o *mqttFlags, log *slog.Logger) (broker.Publisher, func(), error) {
	pub, err := mqtt.New(t.flags.url, mqttConfig(t, o, log))
	if err != nil {
		return nil, nil, usageError{err}
	}
	pctx, cancel := context.WithTimeout(ctx, t.flags.ackTimeout)
	err = pub.Ping(pctx)
	cancel()
	if broker.IsMisconfigured(err) {
		_ = pub.Close()
		return nil, nil, usageError{fmt.Errorf("--broker: %w", err)}
	}
	return pub, func() { _ = pub.Close() }, nil
}
