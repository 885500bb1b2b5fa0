package cli

import (
	"log/slog"
	"net/url"
	"strings"
)

// warnPlaintextCredentials logs a WARN when a NATS, RabbitMQ or Kafka URL carries
// credentials (user info, a token) over a scheme that does not ask for TLS:
// nats:// and ws:// (unless the server itself demands TLS), amqp://, kafka://
// without ?tls=true. Webhooks warn in broker/webhook.
func warnPlaintextCredentials(log *slog.Logger, kind, raw string) {
	for _, one := range strings.Split(raw, ",") {
		u, err := url.Parse(strings.TrimSpace(one))
		if err != nil || u.User == nil {
			continue
		}
		plain := false
		switch kind {
		case "nats":
			plain = u.Scheme == "nats" || u.Scheme == "ws"
		case "rabbitmq":
			plain = u.Scheme == "amqp"
		case "kafka":
			plain = !strings.Contains(strings.ToLower(raw), "tls=true") // the query ends the list
		}
		if plain {
			log.Warn("broker credentials may travel unencrypted: the URL does not ask for TLS "+
				"(use tls://, wss://, amqps:// or kafka://…?tls=true)", slog.String("broker", showBrokerURL(raw)))
			return
		}
	}
}
