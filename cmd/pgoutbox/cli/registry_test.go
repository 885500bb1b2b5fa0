package cli

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// The registry (registry.go) is the one place of the CLI that names the broker
// kinds: no other source file spells a kind, a word that chooses one or a URL
// scheme of one as a string literal, so adding a broker is one entry.
func TestOnlyTheRegistryNamesBrokers(t *testing.T) {
	t.Parallel()
	names := map[string]bool{}
	var schemes []string
	for _, k := range brokerKinds {
		names[k.name] = true
		for _, w := range k.words {
			names[w] = true
		}
		for _, s := range k.schemes {
			names[s] = true
			schemes = append(schemes, s+"://")
		}
	}
	for _, k := range brokerKinds {
		if k.name == "" || len(k.schemes)+len(k.words) == 0 {
			t.Fatalf("kind %q has no name or no --broker form that chooses it", k.name)
		}
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if name == "registry.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatalf("%s: %v", fset.Position(lit.Pos()), err)
			}
			if s == ownHTTP {
				return true // the console and the demo serve HTTP themselves
			}
			if names[strings.ToLower(s)] || hasAnyPrefix(strings.ToLower(s), schemes) {
				t.Errorf("%s: %q names a broker kind: say it in the registry (registry.go)", fset.Position(lit.Pos()), s)
			}
			return true
		})
	}
	if checked < 10 {
		t.Fatalf("checked only %d files", checked)
	}
}

// ownHTTP is the one literal other files may hold: the address of the CLI's
// own web servers (console, demo), not a webhook.
const ownHTTP = "http://"

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// The stream's subjects are derived from --topic-template for NATS only: a
// Kafka topic or RabbitMQ routing key without a dot, or one that starts with a
// placeholder, is fine.
func TestStreamSubjectsAreNATSOnly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		broker, template string
		ok               bool
	}{
		{"kafka://k:9092", "orders", true},
		{"kafka://k:9092", "{aggregate_type}", true},
		{"amqp://h/", "{aggregate_type}.{event_type}", true},
		{"nats://h:4222", "{aggregate_type}", false},
		{"embedded", "orders", false},
		{"nats://h:4222", "events.{aggregate_type}", true},
	} {
		var b brokerFlags
		b.register(pflag.NewFlagSet("test", pflag.ContinueOnError))
		b.url, b.topicTemplate = tc.broker, tc.template
		_, err := b.parse()
		if (err == nil) != tc.ok {
			t.Errorf("--broker %s --topic-template %s: %v, want ok %v", tc.broker, tc.template, err, tc.ok)
		}
	}
}
