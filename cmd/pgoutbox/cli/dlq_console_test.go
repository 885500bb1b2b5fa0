package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/admin"
)

func TestDLQRetryingAndErrorsJSON(t *testing.T) {
	t.Parallel()
	e := newOpsEnv(t)
	evs := e.enqueue(2, "o1", "o2", "o3")
	e.quarantine(evs["o1"][0], "webhook: POST https://x.example/1: 500 Internal Server Error")
	e.quarantine(evs["o2"][0], "webhook: POST https://x.example/2: 500 Internal Server Error")
	e.exec("UPDATE "+e.table("outbox_events")+" SET attempt_count = 2, last_error = 'webhook: POST https://x.example/3: 500 Internal Server Error', available_at = now() + interval '1 hour' WHERE event_id = $1", evs["o3"][0])

	out, errOut, code := run(t, e.args("dlq", "retrying", "--json")...)
	var list []admin.Event
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].ID != evs["o3"][0] || list[0].AttemptCount != 2 {
		t.Fatalf("dlq retrying --json: code %d, stderr %q:\n%s", code, errOut, out)
	}
	out, errOut, code = run(t, e.args("dlq", "errors", "--json")...)
	var gs admin.ErrorGroups
	if code != 0 || json.Unmarshal([]byte(out), &gs) != nil || len(gs.Groups) != 1 || gs.Groups[0].DeadLetters != 2 || gs.Groups[0].Retrying != 1 {
		t.Fatalf("dlq errors --json: code %d, stderr %q:\n%s", code, errOut, out)
	}
	out, _, code = run(t, e.args("dlq", "errors")...)
	if code != 0 || !strings.Contains(out, "500 Internal Server Error ‹ webhook: POST <url>") {
		t.Fatalf("dlq errors:\n%s", out)
	}
	out, _, code = run(t, e.args("status")...)
	if code != 0 || !strings.Contains(out, "blocked behind dead letters") {
		t.Fatalf("status:\n%s", out)
	}
}
