package cli

import (
	"context"
	"log/slog"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/pubsub"
)

// parsePubSub checks the Pub/Sub URL and takes the topic template from
// --topic-template or the URL's path; with neither, the adapter's default
// (pubsub.DefaultTopic, or with --tenants the registry's tenant default).
func parsePubSub(t *brokerTarget) error {
	u, err := pubsub.ParseURL(t.flags.url)
	if err != nil {
		return usagef("--broker: %v", err)
	}
	switch {
	case t.template != nil && u.Topic.String() != "":
		return usagef("--broker names the topic %q and --topic-template names %q: give one", u.Topic.String(), t.template.String())
	case t.template == nil && u.Topic.String() != "":
		t.template = &u.Topic
	}
	if t.template != nil {
		if err := pubsub.CheckTemplate(*t.template); err != nil {
			return usagef("--topic-template: %v", err)
		}
	}
	return nil
}

// pubsubConfig is the adapter's configuration from the flags.
func pubsubConfig(t *brokerTarget) *pubsub.Config {
	cfg := &pubsub.Config{Encoding: t.encoding, Timeout: t.flags.ackTimeout}
	if t.template != nil {
		cfg.Topic = *t.template
	}
	return cfg
}

// openPubSub builds the Pub/Sub client with Application Default Credentials
// (none for an emulator endpoint).
func openPubSub(ctx context.Context, t *brokerTarget, _ *slog.Logger) (broker.Publisher, func(), error) {
	pub, err := pubsub.Dial(ctx, t.flags.url, pubsubConfig(t))
	if err != nil {
		return nil, nil, usageError{err}
	}
	return pub, func() { _ = pub.Close() }, nil
}

// describePubSub names the project, topic template and endpoint; the URL
// holds no secret (ParseURL refuses credentials), but only these parts are
// shown.
func describePubSub(t *brokerTarget) string {
	u, err := pubsub.ParseURL(t.flags.url)
	if err != nil {
		return "Google Cloud Pub/Sub"
	}
	topic := pubsub.DefaultTopic
	if t.template != nil {
		topic = t.template.String()
	}
	d := "Google Cloud Pub/Sub project " + u.Project + ", topic " + topic
	if u.Endpoint != "" {
		d += ", emulator " + u.Endpoint
	}
	return d
}
