package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/broker/aws/sqs"
)

// awsFlags are the flags of the SQS and SNS kinds, and what parse read from
// the URL.
type awsFlags struct {
	allowStandard bool
	region        string // ?region=, else the default chain's
	endpoint      string // ?endpoint=, for emulators and VPC endpoints
}

// awsAllowStandardFlag registers kind's --<kind>-allow-standard flag.
func awsAllowStandardFlag(kind, service string) func(fs *pflag.FlagSet) any {
	return func(fs *pflag.FlagSet) any {
		o := &awsFlags{}
		name := kind + "-allow-standard"
		fs.BoolVar(&o.allowStandard, name, false, fmt.Sprintf("publish to a standard (non-FIFO) %s, which does not keep each aggregate's order (env PGOUTBOX_%s)",
			service, strings.ToUpper(strings.ReplaceAll(name, "-", "_"))))
		return o
	}
}

// parseAWS checks an sqs:// or sns:// URL: nothing but ?region= and
// ?endpoint=, a host only as SQS's queue name, and no credentials, which come
// from the AWS default chain only. needTemplate: the destination must come
// from --topic-template (SNS's topic ARN).
func parseAWS(t *brokerTarget, needTemplate bool) error {
	o := kindFlags[awsFlags](t.flags, t.kind.name)
	raw := strings.TrimSpace(t.flags.url)
	if strings.Contains(raw, "@") {
		// Not shown: the part before '@' would be a secret.
		return usagef("--broker %s://…: credentials are not taken from the URL; they come from the AWS default chain "+
			"(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE and the shared files, or the instance role)", t.kind.schemes[0])
	}
	shown := t.kind.schemes[0] + "://…" // the value only in errors of its own parts
	u, err := url.Parse(raw)
	if err != nil {
		return usagef("--broker %s: not a URL", shown)
	}
	if u.Path != "" && u.Path != "/" || u.Opaque != "" || u.Fragment != "" {
		return usagef("--broker %s: want %s://[queue]?region=…&endpoint=… (the destination goes in --topic-template)", shown, t.kind.schemes[0])
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return usagef("--broker %s: query: %v", shown, err)
	}
	for k, v := range q {
		if !slices.Contains([]string{"region", "endpoint"}, k) || len(v) != 1 {
			return usagef("--broker %s: unknown or repeated query parameter %.40q (want region and endpoint)", shown, k)
		}
	}
	o.region, o.endpoint = q.Get("region"), q.Get("endpoint")
	if o.endpoint != "" {
		e, err := url.Parse(o.endpoint)
		if err != nil || !slices.Contains(awsEndpointSchemes, e.Scheme) || e.Host == "" || e.User != nil {
			return usagef("--broker: ?endpoint= must be an http(s) URL without credentials")
		}
	}
	switch {
	case u.Host != "" && (needTemplate || t.template != nil):
		return usagef("--broker %s: give the destination once, in --topic-template", shown)
	case u.Host != "":
		tmpl, err := broker.ParseTemplate(u.Host)
		if err != nil {
			return usagef("--broker: %v", err)
		}
		t.template = &tmpl
	case needTemplate && t.template == nil:
		return usagef("--topic-template is required for %s: the topic ARN (placeholders allowed)", t.kind.display)
	}
	return nil
}

// awsClientConfig loads the AWS default chain's configuration, with the
// URL's region and endpoint.
func awsClientConfig(ctx context.Context, o *awsFlags) (aws.Config, error) {
	var opts []func(*config.LoadOptions) error
	if o.region != "" {
		opts = append(opts, config.WithRegion(o.region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, usageError{fmt.Errorf("AWS configuration: %w", err)}
	}
	if o.endpoint != "" {
		cfg.BaseEndpoint = aws.String(o.endpoint)
	}
	if cfg.Region == "" {
		return aws.Config{}, usagef("--broker: no AWS region: add ?region= or set AWS_REGION")
	}
	return cfg, nil
}

// openAWS connects to SQS (sns false) or SNS and checks a destination
// without placeholders: it must exist and be FIFO unless allowed.
func openAWS(ctx context.Context, t *brokerTarget, log *slog.Logger, sns bool) (broker.Publisher, func(), error) {
	o := kindFlags[awsFlags](t.flags, t.kind.name)
	cfg, err := awsClientConfig(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	pc := sqs.Config{AllowStandard: o.allowStandard, Timeout: t.flags.ackTimeout, Logger: log, Encoding: t.encoding}
	if t.template != nil {
		pc.Destination = *t.template
	}
	var pub *sqs.Publisher
	if sns {
		pub, err = sqs.NewSNS(ctx, awssns.NewFromConfig(cfg), &pc)
	} else {
		pub, err = sqs.New(ctx, awssqs.NewFromConfig(cfg), &pc)
	}
	switch {
	case errors.Is(err, sqs.ErrNotFIFO):
		return nil, nil, usageError{fmt.Errorf("%w; --%s-allow-standard publishes to it anyway", err, t.kind.name)}
	case broker.IsUnavailable(err) && !broker.IsMisconfigured(err):
		return nil, nil, err
	case err != nil:
		return nil, nil, usageError{err}
	}
	return pub, func() { _ = pub.Close() }, nil
}
