package kinesis

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/wire"
)

// Record is the JSON envelope a record's data holds in the default format:
//
//	{"headers":{"Outbox-Event-Id":"…",…,"traceparent":"…"},
//	 "contentType":"application/json",
//	 "body":{…the payload, byte for byte…}}
//
// headers holds the Outbox-* headers and the producer's headers, as other
// brokers carry them. A JSON payload is "body" exactly as published; any other
// payload is "bodyBase64" (standard base64) instead.
//
// In the CloudEvents format the data is a structured-mode CloudEvents 1.0
// JSON object: the attributes and pgoutbox extensions as members, the payload
// as "data" (JSON) or "data_base64", and the producer's headers, when there
// are any, as the string extension "pgoutboxheaders" holding a JSON object.
type Record struct {
	Headers     map[string]string `json:"headers"`
	ContentType string            `json:"contentType,omitempty"`
	Body        json.RawMessage   `json:"body,omitempty"`
	BodyBase64  []byte            `json:"bodyBase64,omitempty"`
}

// CloudEventsHeadersExtension is the structured-mode extension attribute that
// carries the producer's headers as a JSON object in a string.
const CloudEventsHeadersExtension = "pgoutboxheaders"

// ceBinding names the attributes while they are gathered; the prefix is
// dropped in the JSON object.
var ceBinding = wire.CloudEventsHTTP

// Encode returns the record data of m in e's format, or why m cannot be sent,
// marked Refused (wire.Encoding.Encode's checks).
func Encode(e wire.Encoding, m *broker.Message) ([]byte, error) {
	enc, err := e.Encode(m, ceBinding)
	if err != nil {
		return nil, err
	}
	isJSON := json.Valid(enc.Body) && jsonContentType(enc.ContentType)
	var b bytes.Buffer
	b.Grow(len(enc.Body) + 512)
	if e.Format != wire.FormatCloudEvents {
		headers := maps.Collect(enc.Headers)
		b.WriteString(`{"headers":`)
		writeJSON(&b, headers)
		b.WriteString(`,"contentType":`)
		writeJSON(&b, enc.ContentType)
		writeBody(&b, "body", "bodyBase64", enc.Body, isJSON)
		b.WriteByte('}')
		return b.Bytes(), nil
	}
	producer := map[string]string{}
	b.WriteByte('{')
	for k, v := range enc.Headers {
		name, isAttr := strings.CutPrefix(k, ceBinding.Prefix)
		if !isAttr {
			producer[k] = v
			continue
		}
		writeJSON(&b, name)
		b.WriteByte(':')
		writeJSON(&b, v)
		b.WriteByte(',')
	}
	b.WriteString(`"` + wire.CEAttrDataContentType + `":`)
	writeJSON(&b, enc.ContentType)
	if len(producer) > 0 {
		raw, err := json.Marshal(producer)
		if err != nil {
			return nil, err
		}
		b.WriteString(`,"` + CloudEventsHeadersExtension + `":`)
		writeJSON(&b, string(raw))
	}
	writeBody(&b, "data", "data_base64", enc.Body, isJSON)
	b.WriteByte('}')
	return b.Bytes(), nil
}

// writeBody appends the payload as raw JSON (kept byte for byte) or base64.
func writeBody(b *bytes.Buffer, jsonName, base64Name string, body []byte, isJSON bool) {
	if isJSON {
		b.WriteString(`,"` + jsonName + `":`)
		b.Write(body)
		return
	}
	b.WriteString(`,"` + base64Name + `":"`)
	b.WriteString(base64.StdEncoding.EncodeToString(body))
	b.WriteByte('"')
}

// writeJSON appends v; strings and string maps always marshal.
func writeJSON(b *bytes.Buffer, v any) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	b.Truncate(b.Len() - 1) // Encode's newline
}

func jsonContentType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// maxRecordHeaders bounds the headers ParseRecord accepts.
const maxRecordHeaders = 256

// ParseRecord decodes the data of a record the publisher wrote, in either
// format: the headers (Outbox-* and the producer's, or in the CloudEvents
// format the attributes with the binary-mode "ce-" prefix, datacontenttype as
// "content-type", and the producer's headers) and the payload. A consumer
// hands them to wire.ParseReceived to rebuild the event.
func ParseRecord(data []byte) (headers map[string]string, body []byte, err error) {
	if len(data) > MaxRecordBytes {
		return nil, nil, fmt.Errorf("kinesis: record of %d bytes, above %d", len(data), MaxRecordBytes)
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, nil, fmt.Errorf("kinesis: record is not a JSON object: %w", err)
	}
	if len(probe) > maxRecordHeaders {
		return nil, nil, fmt.Errorf("kinesis: record has %d members, above %d", len(probe), maxRecordHeaders)
	}
	if _, ok := probe[wire.CEAttrSpecVersion]; !ok {
		var r Record
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, nil, fmt.Errorf("kinesis: record envelope: %w", err)
		}
		if len(r.Headers) > maxRecordHeaders {
			return nil, nil, fmt.Errorf("kinesis: record has %d headers, above %d", len(r.Headers), maxRecordHeaders)
		}
		if r.Body != nil {
			return r.Headers, r.Body, nil
		}
		return r.Headers, r.BodyBase64, nil
	}
	headers = map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(probe)) {
		raw := probe[k]
		switch k {
		case "data":
			body = raw
		case "data_base64":
			if err := json.Unmarshal(raw, &body); err != nil {
				return nil, nil, fmt.Errorf("kinesis: record data_base64: %w", err)
			}
		case CloudEventsHeadersExtension:
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, nil, fmt.Errorf("kinesis: record %s: %w", k, err)
			}
			var producer map[string]string
			if err := json.Unmarshal([]byte(s), &producer); err != nil {
				return nil, nil, fmt.Errorf("kinesis: record %s: %w", k, err)
			}
			if len(producer) > maxRecordHeaders {
				return nil, nil, fmt.Errorf("kinesis: record has %d headers, above %d", len(producer), maxRecordHeaders)
			}
			maps.Copy(headers, producer)
		default:
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, nil, fmt.Errorf("kinesis: record attribute %s is not a string", k)
			}
			if k == wire.CEAttrDataContentType {
				headers["content-type"] = s
			} else {
				headers[ceBinding.Prefix+k] = s
			}
		}
	}
	if body == nil {
		return nil, nil, errors.New("kinesis: CloudEvents record without data")
	}
	return headers, body, nil
}
