package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/redact"
	"github.com/pgoutbox/pgoutbox/relay"
)

// destinationsHelp documents --destinations-file in the relay's --help.
const destinationsHelp = `Destinations (--destinations-file FILE, docs/operations.md "Destinations"): one relay
publishes each event to several named destinations, each with its own broker,
settings and routing rules, and its own progress per aggregate lane, so a slow or
broken destination holds back only itself. The file replaces --broker and the
broker flags (each destination has its own, as file keys: topic_template, format,
nats_stream, amqp_exchange, webhook_secret_file, …); broker URLs with credentials
only through broker_env. Not with --tenants or --source cdc. Manage them with
pgoutbox destinations list|drop and dlq --destination.`

// Bounds of the --destinations-file, checked as the tenants file's are
// (yamlfile.go): its size bounds the work and the memory.
const (
	maxDestinationsFile      = 1 << 20 // bytes
	maxDestinationsFileNodes = 50_000  // YAML nodes
	maxDestinationsFileValue = 4096    // bytes of one value
)

// destinationsFile is a checked --destinations-file: each destination's
// broker target parsed (nothing opened yet), its rules and start.
type destinationsFile struct {
	path         string
	destinations []fileDestination
}

type fileDestination struct {
	name   string
	start  relay.Start
	rules  []relay.Rule
	target *brokerTarget
}

// destinationKeys are a destinations[] entry's own keys; the others are
// brokerSettingKeys.
var destinationKeys = []string{"name", "broker", "broker_env", "start", "rules"}

// ruleKeys are the keys of a rule (relay.Rule's JSON names).
var ruleKeys = []string{"all", "aggregate_types", "event_types", "headers"}

// brokerSettingKeys maps the file's keys of broker settings to the relay's
// broker flags: each flag of brokerFlags (the common ones and every registry
// kind's own) but --broker, its dashes as underscores. One mapping for every
// kind: adding a kind's flag to the registry adds its key here.
var brokerSettingKeys = func() map[string]string {
	fs := pflag.NewFlagSet("destination", pflag.ContinueOnError)
	var b brokerFlags
	b.register(fs)
	keys := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "broker" {
			keys[strings.ReplaceAll(f.Name, "-", "_")] = f.Name
		}
	})
	return keys
}()

// entryKeys are every key a destinations[] entry may have, sorted after its
// own.
var entryKeys = func() []string {
	settings := make([]string, 0, len(brokerSettingKeys))
	for k := range brokerSettingKeys {
		settings = append(settings, k)
	}
	slices.Sort(settings)
	return append(slices.Clone(destinationKeys), settings...)
}()

// readDestinationsFile reads and checks path: the YAML strictly (yamlfile.go),
// each destination's name, start and rules as relay.Destination.Validate has
// them, its broker through the registry (brokerFlags.parse) without
// connecting. Errors name the file, the entry and the key, and the line, never
// a value that may hold a secret. ctx (SIGTERM) ends the reading.
func readDestinationsFile(ctx context.Context, path string) (*destinationsFile, error) {
	raw, err := readYAMLFile(ctx, "--destinations-file", path, maxDestinationsFile)
	if err != nil {
		return nil, err
	}
	df, err := parseDestinationsFile(raw, os.Getenv)
	if err != nil {
		return nil, usagef("--destinations-file %s: %w", path, err)
	}
	df.path = path
	return df, nil
}

// parseDestinationsFile parses the YAML of a destinations file; getenv reads
// the variables broker_env names.
func parseDestinationsFile(raw []byte, getenv func(string) string) (*destinationsFile, error) {
	root, err := parseYAMLFile(raw, maxDestinationsFileNodes)
	if err != nil {
		return nil, err
	}
	const none = "lists no destinations (want a 'destinations:' list)"
	if root == nil {
		return nil, errors.New(none)
	}
	df := &destinationsFile{}
	err = eachKey(root, "the file", []string{"destinations"}, func(_ string, v *yaml.Node) error {
		if v.Kind != yaml.SequenceNode {
			return fmt.Errorf("line %d: destinations must be a list", v.Line)
		}
		if len(v.Content) > relay.MaxDestinations {
			return fmt.Errorf("line %d: destinations lists %d entries, above the limit of %d", v.Line, len(v.Content), relay.MaxDestinations)
		}
		for i, e := range v.Content {
			d, err := parseFileDestination(e, fmt.Sprintf("destinations[%d]", i), getenv)
			if err != nil {
				return err
			}
			if slices.ContainsFunc(df.destinations, func(o fileDestination) bool { return o.name == d.name }) {
				return fmt.Errorf("line %d: destinations[%d]: the name %s is used twice", e.Line, i, d.name)
			}
			df.destinations = append(df.destinations, d)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(df.destinations) == 0 {
		return nil, errors.New(none)
	}
	return df, nil
}

// scalar returns v's value, refusing a node that is not one value or is out
// of bounds.
func scalar(v *yaml.Node, where, key string) (string, error) {
	if v.Kind != yaml.ScalarNode {
		return "", fmt.Errorf("line %d: %s.%s must be a single value", v.Line, where, key)
	}
	if len(v.Value) > maxDestinationsFileValue {
		return "", fmt.Errorf("line %d: %s.%s is longer than its limit of %d bytes", v.Line, where, key, maxDestinationsFileValue)
	}
	if v.Tag == "!!null" {
		return "", nil
	}
	return v.Value, nil
}

// parseFileDestination reads one entry of destinations and parses its broker.
func parseFileDestination(n *yaml.Node, where string, getenv func(string) string) (fileDestination, error) {
	var d fileDestination
	var brokerURL, brokerEnv string
	var values []string // the settings' values, hidden from parse's errors
	brokerLine := n.Line
	fs := pflag.NewFlagSet(where, pflag.ContinueOnError)
	var bf brokerFlags
	bf.register(fs)
	err := eachKey(n, where, entryKeys, func(key string, v *yaml.Node) error {
		switch key {
		case "rules":
			rules, err := parseRules(v, where+".rules")
			d.rules = rules
			return err
		case "name", "broker", "broker_env", "start":
			value, err := scalar(v, where, key)
			if err != nil {
				return err
			}
			switch key {
			case "name":
				if relay.ValidateDestinationName(value) != nil {
					return fmt.Errorf("line %d: %s.name must be 1 to 63 characters of a-z, 0-9, '_' and '-', starting with a letter or digit", v.Line, where)
				}
				d.name = value
			case "broker":
				brokerURL, brokerLine = value, v.Line
			case "broker_env":
				if value != "" && !envName.MatchString(value) {
					return fmt.Errorf("line %d: %s.broker_env must be the name of an environment variable (letters, digits and '_')", v.Line, where)
				}
				brokerEnv, brokerLine = value, v.Line
			case "start":
				switch s := relay.Start(value); s {
				case relay.StartNow, relay.StartBackfill:
					d.start = s
				default:
					return fmt.Errorf("line %d: %s.start must be %s or %s", v.Line, where, relay.StartNow, relay.StartBackfill)
				}
			}
			return nil
		}
		// A broker setting: the flag of the same name, set as on the command
		// line; a list sets it once per item.
		flag := brokerSettingKeys[key]
		items := []*yaml.Node{v}
		if v.Kind == yaml.SequenceNode {
			items = v.Content
		}
		for _, item := range items {
			value, err := scalar(item, where, key)
			if err != nil {
				return err
			}
			values = append(values, value)
			if err := fs.Set(flag, value); err != nil {
				// pflag's error quotes the value: say what the flag wants instead.
				return fmt.Errorf("line %d: %s.%s is not a valid %s (value not shown; see --%s in pgoutbox relay --help)",
					item.Line, where, key, fs.Lookup(flag).Value.Type(), flag)
			}
		}
		return nil
	})
	if err != nil {
		return d, err
	}
	switch {
	case d.name == "":
		return d, fmt.Errorf("line %d: %s: name is required", n.Line, where)
	case d.start == "":
		return d, fmt.Errorf("line %d: %s (%s): start is required: now (events committed from its registration on) or backfill (every retained event)", n.Line, where, d.name)
	case len(d.rules) == 0:
		return d, fmt.Errorf("line %d: %s (%s): rules are required, at least one ('- all: true' takes every event)", n.Line, where, d.name)
	case (brokerURL == "") == (brokerEnv == ""):
		return d, fmt.Errorf("line %d: %s (%s): set exactly one of broker and broker_env", n.Line, where, d.name)
	}
	where = fmt.Sprintf("%s (%s)", where, d.name)
	if brokerURL != "" && holdsCredentials(brokerURL) {
		return d, fmt.Errorf("line %d: %s.broker holds credentials (not shown): put the URL in an environment variable and name it with broker_env", brokerLine, where)
	}
	if brokerEnv != "" {
		if brokerURL = getenv(brokerEnv); brokerURL == "" {
			return d, fmt.Errorf("line %d: %s.broker_env %s is not set", brokerLine, where, brokerEnv)
		}
	}
	check := relay.Destination{Name: d.name, Start: d.start, Rules: d.rules, Publisher: unopened{}}
	if err := check.Validate(); err != nil {
		return d, fmt.Errorf("line %d: %w", n.Line, err)
	}
	if err := fs.Set("broker", brokerURL); err != nil {
		return d, fmt.Errorf("line %d: %s: the broker URL is not accepted (not shown)", brokerLine, where)
	}
	if err := checkBounds(fs); err != nil {
		return d, fmt.Errorf("line %d: %s: %s", n.Line, where, fileKeys(err.Error()))
	}
	t, err := bf.parse()
	if err != nil {
		return d, fmt.Errorf("line %d: %s: %s", n.Line, where, fileKeys(hideValues(err.Error(), brokerURL, values)))
	}
	d.target = t
	return d, nil
}

// hideValues replaces in msg, an error of brokerFlags.parse, the broker URL
// (as written and as shown redacted) and the settings' values (as written
// and quoted) by "(not shown)": an error of the file quotes no value.
func hideValues(msg, brokerURL string, values []string) string {
	hide := slices.Clone(values)
	for _, one := range append(strings.Split(brokerURL, ","), brokerURL) {
		one = strings.TrimSpace(one)
		hide = append(hide, one, redact.URL(one), showBrokerURL(one))
		if u, err := url.Parse(one); err == nil {
			hide = append(hide, redactURL(u))
		}
	}
	for _, v := range slices.Clone(hide) {
		hide = append(hide, strconv.Quote(v))
	}
	// Longest first, so that a value inside another is not half hidden.
	slices.SortFunc(hide, func(a, b string) int { return len(b) - len(a) })
	for _, v := range hide {
		if len(v) >= 3 {
			msg = strings.ReplaceAll(msg, v, "(not shown)")
		}
	}
	for _, secret := range redact.Secrets(brokerURL) {
		msg = redact.Text(msg, secret)
	}
	return msg
}

// holdsCredentials reports whether a broker URL written in the file carries a
// user name, a password, a token or a secret parameter.
func holdsCredentials(raw string) bool {
	if strings.Contains(raw, "@") || len(redact.Secrets(raw)) > 0 {
		return true
	}
	for _, one := range strings.Split(raw, ",") {
		if u, err := url.Parse(strings.TrimSpace(one)); err == nil && u.User != nil {
			return true
		}
	}
	return false
}

// fileKeys rewrites the broker flags a message names (--topic-template) as
// the file's keys (topic_template), and --broker as broker.
func fileKeys(msg string) string {
	pairs := [][2]string{{"--broker", "broker"}, {"--broker (PGOUTBOX_BROKER)", "broker (not shown)"}}
	for key, flag := range brokerSettingKeys {
		pairs = append(pairs, [2]string{"--" + flag, key})
	}
	// Longest first: strings.Replacer tries its pairs in order at each place.
	slices.SortFunc(pairs, func(a, b [2]string) int { return cmp.Or(len(b[0])-len(a[0]), strings.Compare(a[0], b[0])) })
	flat := make([]string, 0, 2*len(pairs))
	for _, p := range pairs {
		flat = append(flat, p[0], p[1])
	}
	return strings.NewReplacer(flat...).Replace(msg)
}

// unopened stands for a destination's publisher while the file is checked,
// before any broker is opened (relay.Destination.Validate wants one).
type unopened struct{ broker.Publisher }

// parseRules reads a destination's rules: a list of maps of ruleKeys.
func parseRules(v *yaml.Node, where string) ([]relay.Rule, error) {
	if v.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("line %d: %s must be a list of rules", v.Line, where)
	}
	if len(v.Content) > relay.MaxRules {
		return nil, fmt.Errorf("line %d: %s lists %d rules, above the limit of %d", v.Line, where, len(v.Content), relay.MaxRules)
	}
	var rules []relay.Rule
	for i, n := range v.Content {
		at := fmt.Sprintf("%s[%d]", where, i)
		var r relay.Rule
		err := eachKey(n, at, ruleKeys, func(key string, v *yaml.Node) error {
			switch key {
			case "all":
				value, err := scalar(v, at, key)
				if err != nil {
					return err
				}
				if value != "true" && value != "false" {
					return fmt.Errorf("line %d: %s.all must be true or false", v.Line, at)
				}
				r.All = value == "true"
			case "aggregate_types", "event_types":
				list, err := scalarList(v, at, key)
				if err != nil {
					return err
				}
				if key == "aggregate_types" {
					r.AggregateTypes = list
				} else {
					r.EventTypes = list
				}
			case "headers":
				if v.Kind != yaml.MappingNode {
					return fmt.Errorf("line %d: %s.headers must be a map of header names to values", v.Line, at)
				}
				r.Headers = map[string]string{}
				for j := 0; j+1 < len(v.Content); j += 2 {
					name, err := scalar(v.Content[j], at, "headers")
					if err != nil {
						return err
					}
					value, err := scalar(v.Content[j+1], at, "headers")
					if err != nil {
						return err
					}
					if _, dup := r.Headers[name]; dup {
						return fmt.Errorf("line %d: %s.headers names a header twice", v.Content[j].Line, at)
					}
					r.Headers[name] = value
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// scalarList reads a list of values (one value stands for a list of one).
func scalarList(v *yaml.Node, where, key string) ([]string, error) {
	items := []*yaml.Node{v}
	if v.Kind == yaml.SequenceNode {
		items = v.Content
	}
	out := make([]string, 0, len(items))
	for _, item := range items {
		value, err := scalar(item, where, key)
		if err != nil {
			return nil, err
		}
		out = append(out, value)
	}
	return out, nil
}

// names lists the destinations' names, for logs.
func (df *destinationsFile) names() string {
	names := make([]string, len(df.destinations))
	for i, d := range df.destinations {
		names[i] = d.name
	}
	return strings.Join(names, ",")
}

// open connects to every destination's broker through the registry, each
// wrapped like the single broker (openPublisher: publish spans when tracing
// is on), and returns the relay's destinations and a function that closes
// every broker opened. On an error, what was opened is closed.
func (df *destinationsFile) open(ctx context.Context, traces *tracing, logger *slog.Logger) ([]relay.Destination, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	out := make([]relay.Destination, 0, len(df.destinations))
	for _, d := range df.destinations {
		log := logger.With(slog.String("destination", d.name), slog.String("broker", d.target.describe()))
		pub, closeBroker, err := openPublisher(ctx, d.target, traces, log)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("destination %s: %w", d.name, err)
		}
		closers = append(closers, closeBroker)
		out = append(out, relay.Destination{Name: d.name, Publisher: pub, Rules: d.rules, Start: d.start})
	}
	return out, closeAll, nil
}

// checkDestinationsAlone refuses what does not go with --destinations-file:
// the CDC source and --tenants, which do not support destinations, and
// --broker or any broker flag, which each destination sets in the file.
func checkDestinationsAlone(fs *pflag.FlagSet, isCDC, tenants bool) error {
	switch {
	case isCDC:
		return usagef("--destinations-file is not supported with --source cdc: the CDC source publishes to one broker; use the polling relay for destinations (docs/operations.md, \"Destinations\")")
	case tenants:
		return usagef("--destinations-file is not supported with --tenants or --tenants-file: a relay with destinations serves one outbox (--schema); run one per outbox (docs/operations.md, \"Destinations\")")
	}
	var given []string
	for _, flag := range append([]string{"broker"}, slices.Sorted(maps.Values(brokerSettingKeys))...) {
		if fs.Changed(flag) {
			given = append(given, "--"+flag)
		}
	}
	if len(given) > 0 {
		return usagef("--destinations-file and %s cannot be combined: each destination names its broker and settings in the file", strings.Join(given, ", "))
	}
	return nil
}
