package adminhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/relay"
)

// The destinations of relays with destinations (docs/design.md,
// "Destinations"): their page, their dead letters (the dead-letter list and
// its actions with a destination parameter) and an event's state at each.

// maxDestinationField bounds the destination parameter (a name is at most 63
// bytes; admin checks it before any SQL).
const maxDestinationField = 100

// destinationOf reads the request's destination parameter: "" for none.
func destinationOf(r *http.Request) (string, error) {
	return field(r, "destination", maxDestinationField)
}

type destinationsBody struct {
	Destinations []destinationRow
}

type destinationRow struct {
	admin.Destination
	// RulesText is the rules as text (shown escaped).
	RulesText string
	// DLQLink lists its dead letters.
	DLQLink string
}

func (h *Handler) destinationsPage(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Destinations", Nav: "destinations"}
	h.page(w, r, "destinations", v, func(a *admin.Admin) (any, error) {
		v.Live = h.link("/destinations", v.Schema, "partial", "1")
		ds, err := a.Destinations(r.Context())
		if err != nil {
			return nil, err
		}
		b := &destinationsBody{}
		for _, d := range ds {
			b.Destinations = append(b.Destinations, destinationRow{Destination: d, RulesText: rulesText(d.Rules),
				DLQLink: h.link("/dlq", v.Schema, "destination", d.Name)})
		}
		return b, nil
	})
}

// rulesText writes a destination's recorded rules as one line, e.g.
// `aggregate type "order" or "invoice" and header "region" = "eu"; all`: the
// rules are alternatives (;), a rule's fields must all hold (and). Rules it
// cannot read are shown as recorded.
func rulesText(raw json.RawMessage) string {
	var rules []relay.Rule
	if err := json.Unmarshal(raw, &rules); err != nil || len(rules) == 0 {
		return string(raw)
	}
	quoted := func(vs []string) string {
		q := make([]string, len(vs))
		for i, v := range vs {
			q[i] = strconv.Quote(v)
		}
		return strings.Join(q, " or ")
	}
	out := make([]string, 0, len(rules))
	for _, ru := range rules {
		if ru.All {
			out = append(out, "every event")
			continue
		}
		var parts []string
		if len(ru.AggregateTypes) > 0 {
			parts = append(parts, "aggregate type "+quoted(ru.AggregateTypes))
		}
		if len(ru.EventTypes) > 0 {
			parts = append(parts, "event type "+quoted(ru.EventTypes))
		}
		keys := make([]string, 0, len(ru.Headers))
		for k := range ru.Headers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("header %q = %q", k, ru.Headers[k]))
		}
		out = append(out, strings.Join(parts, " and "))
	}
	return strings.Join(out, "; ")
}

// eventDestination is an event's state at one destination, as its page
// shows it.
type eventDestination struct {
	admin.EventDestination
	DLQLink string
}
