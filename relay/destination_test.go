package relay

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/broker/null"
)

func TestDestinationValidate(t *testing.T) {
	pub := &null.Publisher{}
	ok := Destination{Name: "analytics", Publisher: pub, Rules: []Rule{{All: true}}, Start: StartNow}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid destination refused: %v", err)
	}
	long := strings.Repeat("x", 300)
	for _, tc := range []struct {
		name string
		edit func(d *Destination)
		want string
	}{
		{"empty name", func(d *Destination) { d.Name = "" }, "name"},
		{"upper case", func(d *Destination) { d.Name = "Analytics" }, "name"},
		{"sql in name", func(d *Destination) { d.Name = "a'; DROP TABLE x; --" }, "name"},
		{"long name", func(d *Destination) { d.Name = long }, "name"},
		{"no publisher", func(d *Destination) { d.Publisher = nil }, "Publisher is nil"},
		{"no start", func(d *Destination) { d.Start = "" }, "Start must be set"},
		{"bad start", func(d *Destination) { d.Start = "yesterday" }, "must be"},
		{"no rules", func(d *Destination) { d.Rules = nil }, "at least one rule"},
		{"empty rule", func(d *Destination) { d.Rules = []Rule{{}} }, "matches nothing"},
		{"all and more", func(d *Destination) { d.Rules = []Rule{{All: true, EventTypes: []string{"x"}}} }, "cannot be combined"},
		{"empty value", func(d *Destination) { d.Rules = []Rule{{AggregateTypes: []string{""}}} }, "1 to 200 bytes"},
		{"long value", func(d *Destination) { d.Rules = []Rule{{EventTypes: []string{long}}} }, "1 to 200 bytes"},
		{"empty header name", func(d *Destination) { d.Rules = []Rule{{Headers: map[string]string{"": "v"}}} }, "header name"},
		{"too many rules", func(d *Destination) { d.Rules = make([]Rule, MaxRules+1); d.Rules[0].All = true }, "rules, above the limit"},
		{"too many values", func(d *Destination) { d.Rules = []Rule{{EventTypes: make([]string, MaxRuleValues+1)}} }, "values, above the limit"},
		{"rules too large as JSON", func(d *Destination) {
			vs := make([]string, 400)
			for i := range vs {
				vs[i] = strings.Repeat("v", 190) + fmt.Sprint(i)
			}
			d.Rules = []Rule{{EventTypes: vs}}
		}, "bytes as JSON, above the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ok
			tc.edit(&d)
			err := d.Validate()
			if !errors.Is(err, ErrInvalidDestination) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an ErrInvalidDestination saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), long) {
				t.Fatalf("the error quotes a 300-byte value in full: %.120s…", err)
			}
		})
	}
}

func TestValidateDestinations(t *testing.T) {
	pub := &null.Publisher{}
	d := Destination{Name: "a", Publisher: pub, Rules: []Rule{{All: true}}, Start: StartBackfill}
	if err := validateDestinations([]Destination{d, d}); err == nil || !strings.Contains(err.Error(), "used twice") {
		t.Fatalf("a repeated name: got %v", err)
	}
	many := make([]Destination, MaxDestinations+1)
	if err := validateDestinations(many); !errors.Is(err, ErrInvalidDestination) {
		t.Fatalf("too many destinations: got %v", err)
	}
}

func TestRuleMatch(t *testing.T) {
	h := map[string]string{"region": "eu", "tier": "gold"}
	for _, tc := range []struct {
		rule Rule
		want bool
	}{
		{Rule{All: true}, true},
		{Rule{AggregateTypes: []string{"order", "invoice"}}, true},
		{Rule{AggregateTypes: []string{"invoice"}}, false},
		{Rule{EventTypes: []string{"created"}}, true},
		{Rule{AggregateTypes: []string{"order"}, EventTypes: []string{"shipped"}}, false},
		{Rule{Headers: map[string]string{"region": "eu"}}, true},
		{Rule{Headers: map[string]string{"region": "us"}}, false},
		{Rule{Headers: map[string]string{"missing": ""}}, false},
		{Rule{Headers: map[string]string{"region": "eu", "tier": "gold"}, EventTypes: []string{"created"}}, true},
	} {
		if got := tc.rule.Match("order", "created", h); got != tc.want {
			t.Errorf("%+v.Match = %v, want %v", tc.rule, got, tc.want)
		}
	}
	d := Destination{Rules: []Rule{{AggregateTypes: []string{"invoice"}}, {EventTypes: []string{"created"}}}}
	if !d.Match("order", "created", nil) || d.Match("order", "shipped", nil) {
		t.Fatal("a destination matches when any of its rules does")
	}
}
