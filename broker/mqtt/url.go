package mqtt

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/brokerurl"
)

// server is a checked broker URL.
type server struct {
	paho     string // tcp://host:port or ssl://host:port, for paho
	display  string // mqtt[s]://[user@]host:port, for logs and errors
	host     string
	addr     string // host:port, to dial
	username string
	tls      bool
}

// urlKind is the form of the broker URL.
var urlKind = brokerurl.Kind{
	Pkg: "mqtt", Schemes: []string{"mqtt", "mqtts"}, Form: "mqtt[s]://[user@]host[:port]",
	Credentials: "PGOUTBOX_MQTT_PASSWORD or --mqtt-password-file",
}

// parseURL checks raw: mqtt://[user@]host[:port] or mqtts://[user@]host[:port],
// the port defaulting to 1883 or 8883. A URL carrying a password is refused
// without echoing it: a password comes from the environment or a file.
func parseURL(raw string) (*server, error) {
	port := "1883"
	if strings.HasPrefix(strings.ToLower(raw), "mqtts:") {
		port = "8883"
	}
	u, hostport, err := urlKind.Host(raw, port)
	if err != nil {
		return nil, err
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("mqtt: broker URL: want %s://[user@]host[:port] without path, query or fragment", u.Scheme)
	}
	s := &server{username: u.User.Username(), host: u.Hostname(), tls: u.Scheme == "mqtts"}
	scheme := "tcp"
	if s.tls {
		scheme = "ssl"
	}
	s.addr = hostport
	s.paho = scheme + "://" + hostport
	user := ""
	if s.username != "" {
		user = url.User(s.username).String() + "@"
	}
	s.display = u.Scheme + "://" + user + hostport
	return s, nil
}
