package pipeline

import (
	"encoding/json"
	"fmt"

	"github.com/pgoutbox/pgoutbox"
)

// DecodeHeaders reads an outbox row's headers column (a JSON object of
// strings), for every source: the relay's claim, the CDC source's decoder and
// its table path. Most events carry none: "{}" is not worth encoding/json's
// reflection, nor a map (publishers only read Headers; nil is no headers). A
// column that is not such an object (written by a raw INSERT) gives nil and
// the refusal to keep in Event.Refused: the event is quarantined unsent.
// source prefixes the refusal ("relay", "cdc").
func DecodeHeaders(source string, id pgoutbox.UUID, raw []byte) (map[string]string, error) {
	if string(raw) == "{}" {
		return nil, nil
	}
	h := map[string]string{}
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Errorf("%s: event %s refused before publishing: headers are not a JSON object of strings: %w", source, id, err)
	}
	if h == nil { // JSON null, which Unmarshal takes for "no map"
		return nil, fmt.Errorf("%s: event %s refused before publishing: headers are not a JSON object of strings: null", source, id)
	}
	return h, nil
}
