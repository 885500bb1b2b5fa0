package cli

import (
	"context"
	"log/slog"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/kinesis"
)

// parseKinesis checks the kinesis:// URL and takes the stream template from
// --topic-template or, without it, from the URL. The URL is parsed with
// net/url first (to find its kind), which refuses '{' in a host, so a stream
// template with placeholders goes in --topic-template.
func parseKinesis(t *brokerTarget) error {
	u, err := kinesis.ParseURL(t.flags.url)
	if err != nil {
		return usagef("--broker: %v", err)
	}
	switch {
	case t.template != nil && u.Stream.String() != "":
		return usagef("--broker names the stream %q and --topic-template names %q: give one", u.Stream.String(), t.template.String())
	case t.template == nil && u.Stream.String() == "":
		return usagef("--broker: no Kinesis stream: name it in the URL (kinesis://<stream>) or in --topic-template")
	case t.template == nil:
		t.template = &u.Stream
	}
	if err := kinesis.CheckTemplate(*t.template); err != nil {
		return usagef("--topic-template: %v", err)
	}
	return nil
}

// kinesisTenants requires the stream template to tell tenants apart.
func kinesisTenants(t *brokerTarget) error {
	if !t.template.Uses("tenant") {
		return usagef("serving several outboxes (--tenants), the Kinesis stream template %q must hold {tenant}, or tenants' events would share a stream", t.template.String())
	}
	return nil
}

// openKinesis builds the Kinesis client from the AWS default credential chain.
func openKinesis(ctx context.Context, t *brokerTarget, _ *slog.Logger) (broker.Publisher, func(), error) {
	pub, err := kinesis.Dial(ctx, t.flags.url, &kinesis.DialConfig{Config: kinesis.Config{
		Stream: *t.template, Encoding: t.encoding, Timeout: t.flags.ackTimeout,
	}})
	if err != nil {
		return nil, nil, usageError{err}
	}
	return pub, func() { _ = pub.Close() }, nil
}

// describeKinesis names the stream, region and endpoint; the URL holds no
// secret (ParseURL refuses credentials), but only these parts are shown.
func describeKinesis(t *brokerTarget) string {
	d := "Amazon Kinesis stream " + t.template.String()
	if u, err := kinesis.ParseURL(t.flags.url); err == nil {
		if u.Region != "" {
			d += ", region " + u.Region
		}
		if u.Endpoint != "" {
			d += ", endpoint " + u.Endpoint
		}
	}
	return d
}
