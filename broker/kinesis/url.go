package kinesis

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/pgoutbox/pgoutbox/broker"
	"github.com/pgoutbox/pgoutbox/internal/brokerurl"
)

// urlKind is the form of the URL.
var urlKind = brokerurl.Kind{
	Pkg: "kinesis", Schemes: []string{"kinesis"}, Form: "kinesis://<stream>[?region=…&endpoint=…]",
	Credentials: "the AWS default chain (AWS_ACCESS_KEY_ID, AWS_PROFILE, roles)",
}

// URL is a parsed kinesis:// URL.
type URL struct {
	// Stream is the stream name template; its String is empty when the URL
	// names none.
	Stream broker.Template
	// Region is the AWS region; empty means the default chain's (AWS_REGION,
	// the shared config file).
	Region string
	// Endpoint overrides the Kinesis endpoint (an emulator, a VPC endpoint):
	// an http or https URL without credentials. Empty means AWS's.
	Endpoint string
}

// ParseURL parses kinesis://<stream-template>[?region=<region>&endpoint=<url>].
// The stream template may hold placeholders such as {aggregate_type}; it may
// be empty when Config.Stream names the stream instead. The URL
// must not hold credentials: they come from the AWS default chain only. Errors
// never quote the URL, which could hold a secret.
func ParseURL(raw string) (URL, error) {
	stream, q, err := urlKind.Name(raw, "region", "endpoint")
	if err != nil {
		return URL{}, err
	}
	if strings.Contains(stream, "/") {
		return URL{}, errors.New("kinesis: the URL holds a path after the stream name; want kinesis://<stream>[?region=…&endpoint=…]")
	}
	var u URL
	if stream != "" {
		t, err := broker.ParseTemplate(stream)
		if err != nil {
			return URL{}, fmt.Errorf("kinesis: stream: %w", err)
		}
		if err := CheckTemplate(t); err != nil {
			return URL{}, err
		}
		u.Stream = t
	}
	if r, ok := q["region"]; ok {
		if err := checkRegion(r); err != nil {
			return URL{}, err
		}
		u.Region = r
	}
	if e, ok := q["endpoint"]; ok {
		if err := checkEndpoint(e); err != nil {
			return URL{}, err
		}
		u.Endpoint = e
	}
	return u, nil
}

// checkRegion accepts region names such as us-east-1: lower-case letters,
// digits and '-', at most 32.
func checkRegion(r string) error {
	if r == "" || len(r) > 32 {
		return errors.New("kinesis: region: want a name such as us-east-1")
	}
	for i := 0; i < len(r); i++ {
		if c := r[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return errors.New("kinesis: region: want a name such as us-east-1 (a-z, 0-9, '-')")
		}
	}
	return nil
}

// checkEndpoint accepts an http or https URL with a host and no credentials,
// query or fragment.
func checkEndpoint(s string) error {
	e, err := url.Parse(s)
	switch {
	case err != nil:
		return errors.New("kinesis: endpoint is not a URL")
	case e.User != nil:
		return errors.New("kinesis: endpoint must not hold credentials: they come from the AWS default chain")
	case e.Scheme != "http" && e.Scheme != "https":
		return errors.New("kinesis: endpoint: want an http:// or https:// URL")
	case e.Host == "" || e.RawQuery != "" || e.Fragment != "":
		return errors.New("kinesis: endpoint: want scheme://host[:port][/path]")
	}
	return nil
}
