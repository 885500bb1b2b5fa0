package cli

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/visible"
)

// terminalHostile are texts a producer or a broker may put in an event to
// steer the terminal of whoever reads pgoutbox dlq's output.
var terminalHostile = []string{
	"\x1b]0;pwned\x07",                                     // window title
	"\x1b[2J\x1b[H",                                        // clear the screen
	"ok\n2 quarantined events\nEVENT forged",               // forged lines
	"\r\x1b[Kreplaced",                                     // rewrite the line
	"invoice\u202egpj.exe",                                 // right-to-left override
	"\u2066admin\u2069\u200b\u200d\ufeff",                  // isolates, zero-width
	"\u009b31mred\u0085",                                   // C1 controls
	"\x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\", // hyperlink
}

// No producer-controlled terminal escape, bidi override, zero-width character
// or line break reaches the terminal raw from dlq list or show; JSON output
// carries the same strings, escaped.
func TestDLQOutputEscapesProducerText(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	evs := e.enqueue(1, "h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7")
	for i, h := range terminalHostile {
		id := evs["h"+strconv.Itoa(i)][0]
		e.exec("UPDATE "+e.table("outbox_events")+` SET aggregate_id = $2, event_type = $3,
		  headers = jsonb_build_object('x-note', $4::text, $4::text, 'v'), payload = jsonb_build_object('note', $4::text),
		  claimed_by = $4 WHERE event_id = $1`, id, "h"+strconv.Itoa(i)+h, "t"+h, h)
		e.quarantine(id, "error: "+h)
	}
	clean := func(what, out string) {
		t.Helper()
		for _, r := range out {
			if r != '\n' && r != '\t' && visible.Hidden(r) {
				t.Errorf("%s: %U reaches the terminal:\n%s", what, r, out)
				return
			}
		}
		if strings.Contains(out, "\n2 quarantined events\n") || strings.Contains(out, "\nEVENT forged") {
			t.Errorf("%s: a forged line:\n%s", what, out)
		}
	}
	out, errOut, code := run(t, e.args("dlq", "list")...)
	if code != 0 {
		t.Fatalf("dlq list: %d %s", code, errOut)
	}
	clean("dlq list", out)
	if n := strings.Count(out, "\n"); n != len(terminalHostile)+2 {
		t.Errorf("dlq list: %d lines for %d events:\n%s", n, len(terminalHostile), out)
	}
	if !strings.Contains(out, `\u001b]0;pwned\u0007`) || !strings.Contains(out, `invoice\u202egpj.exe`) {
		t.Errorf("dlq list does not show the escapes:\n%s", out)
	}
	out, _, _ = run(t, e.args("dlq", "list", "--json")...)
	clean("dlq list --json", out)
	var list []admin.Event
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != len(terminalHostile) {
		t.Fatalf("dlq list --json: %v\n%s", err, out)
	}
	got := map[string]bool{}
	for _, ev := range list {
		got[ev.LastError] = true
	}
	for _, h := range terminalHostile {
		if !got["error: "+h] {
			t.Errorf("dlq list --json lost %q", h)
		}
	}
	for i := range terminalHostile {
		id := evs["h"+strconv.Itoa(i)][0].String()
		out, errOut, code := run(t, e.args("dlq", "show", id)...)
		if code != 0 {
			t.Fatalf("dlq show: %d %s", code, errOut)
		}
		clean("dlq show", out)
		out, _, _ = run(t, e.args("dlq", "show", id, "--json")...)
		clean("dlq show --json", out)
		var ev admin.Event
		if err := json.Unmarshal([]byte(out), &ev); err != nil || ev.Headers["x-note"] != terminalHostile[i] {
			t.Errorf("dlq show --json: %v %q", err, ev.Headers["x-note"])
		}
	}
}
