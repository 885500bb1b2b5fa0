package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/redact"
	"github.com/pgoutbox/pgoutbox/wire"
)

// brokerHelp documents --broker in --help, one paragraph per kind of the registry.
var brokerHelp = func() string {
	var b strings.Builder
	b.WriteString(`Brokers (--broker, env PGOUTBOX_BROKER; there is no default: without one the
command refuses to start, exit status 2):`)
	for _, k := range brokerKinds {
		b.WriteString("\n" + k.help)
	}
	b.WriteString(`

Templates (--topic-template, and a webhook URL's path) may use {aggregate_type},
{aggregate_id}, {event_type}, {schema_version} and {tenant} (the schema, or with
--tenants the tenant name); a webhook puts each value in the path as one escaped
segment. With --format cloudevents the source is /pgoutbox/<schema> unless
--ce-source, whichever command publishes.`)
	return b.String()
}()

// brokerFlags select and configure the broker of the relay (and of replay, the
// console and cdc recover): the common flags, and each kind's own (registry.go).
type brokerFlags struct {
	url           string
	topicTemplate string
	ackTimeout    time.Duration
	format        string
	ceSource      string
	kinds         map[string]any // each kind's flags by its name (brokerKind.flags)
}

func (b *brokerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&b.url, "broker", "", "where to publish, required: "+brokerChoices()+" (env PGOUTBOX_BROKER) (no default)")
	fs.StringVar(&b.topicTemplate, "topic-template", "", "destination template: NATS subject (env PGOUTBOX_TOPIC_TEMPLATE) (default per broker)")
	fs.DurationVar(&b.ackTimeout, "ack-timeout", 5*time.Second, "how long to wait for the broker's ack of one message; the request timeout of a webhook (env PGOUTBOX_ACK_TIMEOUT)")
	fs.StringVar(&b.format, "format", wire.FormatNameOutbox, "wire format: outbox (Outbox-* headers) or cloudevents (CloudEvents 1.0 binary mode: "+
		cloudEventsBindings()+"; see docs/consumer.md) (env PGOUTBOX_FORMAT)")
	fs.StringVar(&b.ceSource, "ce-source", "", "CloudEvents source attribute of --format cloudevents, a URI-reference (env PGOUTBOX_CE_SOURCE) (default /pgoutbox/<schema>)")
	b.kinds = map[string]any{}
	for _, k := range brokerKinds {
		if k.flags != nil {
			b.kinds[k.name] = k.flags(fs)
		}
	}
}

// kindFlags returns the flags of the kind named kind (brokerKind.flags).
func kindFlags[T any](b *brokerFlags, kind string) *T {
	return b.kinds[kind].(*T)
}

// kindNamed returns the registry's entry of a kind, nil if there is none.
func kindNamed(name string) *brokerKind {
	for _, k := range brokerKinds {
		if k.name == name {
			return k
		}
	}
	return nil
}

// kindOfScheme returns the kind a URL scheme chooses, nil if none does.
func kindOfScheme(scheme string) *brokerKind {
	for _, k := range brokerKinds {
		if slices.Contains(k.schemes, strings.ToLower(scheme)) {
			return k
		}
	}
	return nil
}

// kindOfBroker returns the kind a --broker value chooses, nil if none does.
func kindOfBroker(raw string) *brokerKind {
	for _, k := range brokerKinds {
		if slices.Contains(k.words, raw) {
			return k
		}
	}
	scheme, _, ok := strings.Cut(strings.TrimSpace(raw), "://")
	if !ok {
		return nil
	}
	return kindOfScheme(scheme)
}

// benchRelayEnv is bench.Config.RelayEnv: for a relay with the id relayID
// publishing to raw (a --broker value), its kind's own flags (by the
// variables their usage names) and secrets (brokerKind.secretEnv) as this
// process has them, then the settings each relay needs its own of
// (brokerKind.perRelay), which win.
func benchRelayEnv(raw, relayID string) []string {
	k := kindOfBroker(raw)
	if k == nil {
		return nil
	}
	names := slices.Clone(k.secretEnv)
	if k.flags != nil {
		fs := pflag.NewFlagSet(k.name, pflag.ContinueOnError)
		k.flags(fs)
		fs.VisitAll(func(f *pflag.Flag) {
			if m := envInUsage.FindStringSubmatch(f.Usage); m != nil {
				names = append(names, m[1])
			}
		})
	}
	var env []string
	for _, name := range names {
		if v := os.Getenv(name); v != "" {
			env = append(env, name+"="+v)
		}
	}
	if k.perRelay != nil {
		env = append(env, k.perRelay(relayID)...)
	}
	return env
}

// benchSecrets are the values of every kind's secret variables this process
// has, for the bench to hide (bench.Config.Secrets).
func benchSecrets() []string {
	var out []string
	for _, k := range brokerKinds {
		for _, name := range k.secretEnv {
			if v := os.Getenv(name); v != "" {
				out = append(out, v)
			}
		}
	}
	return out
}

// brokerChoices lists the --broker forms, for help and errors: the URL
// schemes first, then the kinds chosen by a word.
func brokerChoices() string {
	var urls, words []string
	for _, k := range brokerKinds {
		if len(k.schemes) > 0 {
			urls = append(urls, k.choices...)
		} else {
			words = append(words, k.choices...)
		}
	}
	all := append(urls, words...)
	return strings.Join(all[:len(all)-1], ", ") + " or " + all[len(all)-1]
}

// cloudEventsBindings says where each kind puts the CloudEvents attributes,
// e.g. "ce-* headers on NATS and webhooks, ce_* on Kafka".
func cloudEventsBindings() string {
	var bindings []string
	on := map[string][]string{}
	for _, k := range brokerKinds {
		if k.cloudEvents == "" {
			continue
		}
		if on[k.cloudEvents] == nil {
			bindings = append(bindings, k.cloudEvents)
		}
		on[k.cloudEvents] = append(on[k.cloudEvents], k.display)
	}
	parts := make([]string, len(bindings))
	for i, b := range bindings {
		parts[i] = b + " on " + strings.Join(on[b], " and ")
	}
	return strings.Join(parts, ", ")
}

// brokerTarget is a checked --broker choice, ready to open.
type brokerTarget struct {
	flags          *brokerFlags
	kind           *brokerKind
	template       *broker.Template
	streamSubjects []string // NATS (parseNATS)
	encoding       wire.Encoding
}

// schemeShape is a URL scheme as RFC 3986 has it, bounded: the one part of a
// broker URL that does not parse that an error shows.
var schemeShape = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]{0,15}$`)

// redactURL names a URL without its credentials (internal/redact).
func redactURL(u *url.URL) string { return redact.URL(u.String()) }

// parse checks the broker flags without connecting anywhere, so that a typo fails
// at start-up with one line. The CloudEvents source, unless
// --ce-source, is each event's own (wire.Encoding.Source).
func (b *brokerFlags) parse() (*brokerTarget, error) {
	t := &brokerTarget{flags: b}
	format, err := wire.ParseFormat(b.format)
	if err != nil {
		return nil, usagef("--format: %v", err)
	}
	t.encoding.Format = format
	if format == wire.FormatCloudEvents {
		// Empty: each event's own, /pgoutbox/<schema> (wire.Encoding.Source).
		t.encoding.CloudEventsSource = b.ceSource
		if err := t.encoding.Validate(); err != nil {
			return nil, usagef("--ce-source: %v", err)
		}
	} else if b.ceSource != "" {
		return nil, usagef("--ce-source applies to --format cloudevents only")
	}
	if strings.TrimSpace(b.url) == "" {
		return nil, usagef("no broker: set --broker or PGOUTBOX_BROKER (there is no default); want one of %s", brokerChoices())
	}
	for _, k := range brokerKinds {
		if slices.Contains(k.words, b.url) {
			t.kind = k
		}
	}
	if t.kind == nil {
		u, err := url.Parse(strings.TrimSpace(strings.Split(b.url, ",")[0]))
		if err != nil || u.Scheme == "" {
			// Not shown, not even redacted: a value that does not parse cannot be
			// told apart into credentials and the rest (a token put in the
			// wrong variable has no '@').
			shown := "(PGOUTBOX_BROKER)"
			if scheme, _, ok := strings.Cut(b.url, "://"); ok && schemeShape.MatchString(scheme) {
				shown = scheme + "://…"
			}
			return nil, usagef("--broker %s is not a broker URL; the value is not shown, as it may hold credentials (want one of %s)", shown, brokerChoices())
		}
		if t.kind = kindOfScheme(u.Scheme); t.kind == nil {
			return nil, usagef("--broker %s: unknown scheme %q (want one of %s)", redactURL(u), u.Scheme, brokerChoices())
		}
	}
	if b.topicTemplate != "" {
		tmpl, err := broker.ParseTemplate(b.topicTemplate)
		if err != nil {
			return nil, usagef("--topic-template: %v", err)
		}
		t.template = &tmpl
	}
	if t.kind.parse != nil {
		if err := t.kind.parse(t); err != nil {
			return nil, err
		}
	}
	if b.ackTimeout <= 0 {
		return nil, usagef("--ack-timeout must be positive, got %s", b.ackTimeout)
	}
	return t, nil
}

// describe names the broker for logs and audit rows, without credentials
// (internal/redact, the one place that knows what a secret looks like).
func (t *brokerTarget) describe() string {
	if t.kind.describe != nil {
		return t.kind.describe(t)
	}
	return showBrokerURL(t.flags.url)
}

// showBrokerURL is the strictest display of a --broker URL (internal/redact's
// Endpoint): a user name is the whole secret of nats://token@host, and only
// the query of a kind with publicQuery (kafka://'s tls, sasl) is shown.
func showBrokerURL(raw string) string {
	scheme, _, _ := strings.Cut(strings.TrimSpace(raw), "://")
	k := kindOfScheme(scheme)
	if d := redact.Endpoint(raw, k != nil && k.publicQuery); d != "" {
		return d
	}
	return "(broker URL hidden)"
}

// open connects to the broker (starting the embedded one if chosen) and returns
// the publisher and a function that closes everything it opened.
func (t *brokerTarget) open(ctx context.Context, log *slog.Logger) (broker.Publisher, func(), error) {
	warnPlaintextCredentials(log, t)
	return t.kind.open(ctx, t, log)
}

// system is the messaging.system attribute of publish spans.
func (t *brokerTarget) system() string {
	if t.kind.system != "" {
		return t.kind.system
	}
	return t.kind.name
}

// destination names a message's subject, topic or routing key for publish spans,
// from --topic-template or the adapter's default (webhooks: the aggregate type).
func (t *brokerTarget) destination() func(m *broker.Message) string {
	tmpl := t.template
	if tmpl == nil {
		if t.kind.destination == "" {
			return nil
		}
		d := broker.MustParseTemplate(t.kind.destination)
		tmpl = &d
	}
	return tmpl.Expand
}

// forTenants makes the broker target tell tenants apart (--tenants): a default
// template with {tenant}, and an explicit one without it refused.
func (t *brokerTarget) forTenants() error {
	if t.kind.tenants != nil {
		return t.kind.tenants(t)
	}
	return t.tenantTemplate()
}

// tenantTemplate is the tenant rule of a kind with a destination template: an
// explicit --topic-template must hold {tenant}; else the kind's tenant default.
func (t *brokerTarget) tenantTemplate() error {
	if t.template != nil {
		if !t.template.Uses("tenant") {
			return usagef("--topic-template %q: serving several outboxes (--tenants), the destination must hold {tenant}, or tenants' events would share it (and consumers' aggregates could collide)", t.template.String())
		}
		return nil
	}
	if t.kind.tenantDestination == "" {
		return fmt.Errorf("no tenant template for broker kind %q", t.kind.name)
	}
	tmpl, err := broker.ParseTemplate(t.kind.tenantDestination)
	if err != nil {
		return err
	}
	t.template = &tmpl
	return nil
}

// warnPlaintextCredentials logs a WARN when credentials — the URL's user info
// (a token, a user and password), or the password the kind read from the
// environment or a file (brokerKind.password) — go to a URL that does not ask
// for TLS (brokerKind.plaintext). It is the one such warning of every kind.
func warnPlaintextCredentials(log *slog.Logger, t *brokerTarget) {
	kind, raw := t.kind, t.flags.url
	if kind.plaintext == nil {
		return
	}
	password := kind.password != nil && kind.password(t) != ""
	for _, one := range strings.Split(raw, ",") {
		u, err := url.Parse(strings.TrimSpace(one))
		if err != nil || (u.User == nil && !password) {
			continue
		}
		if kind.plaintext(u, raw) {
			log.Warn("broker credentials may travel unencrypted: the URL does not ask for TLS (use "+kind.tls+")",
				slog.String("broker", showBrokerURL(raw)))
			return
		}
	}
}
