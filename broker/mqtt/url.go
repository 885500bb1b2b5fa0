package mqtt

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"unicode"
)

// server is a checked broker URL.
type server struct {
	paho     string // tcp://host:port or ssl://host:port, for paho
	display  string // mqtt[s]://[user@]host:port, for logs and errors
	host     string
	username string
	tls      bool
}

// parseURL checks raw: mqtt://[user@]host[:port] or mqtts://[user@]host[:port],
// the port defaulting to 1883 or 8883. A URL carrying a password is refused
// without echoing it: a password comes from the environment or a file.
func parseURL(raw string) (*server, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, errors.New("mqtt: empty broker URL")
	}
	if strings.IndexFunc(raw, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return nil, errors.New("mqtt: malformed broker URL: it contains whitespace or a control character")
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // ue.URL may hold a password
		}
		return nil, fmt.Errorf("mqtt: malformed broker URL: %w", err)
	}
	if _, has := u.User.Password(); has {
		return nil, errors.New("mqtt: the broker URL carries a password: pass it through PGOUTBOX_MQTT_PASSWORD or --mqtt-password-file instead")
	}
	s := &server{username: u.User.Username()}
	port := "1883"
	switch u.Scheme {
	case "mqtt":
	case "mqtts":
		s.tls, port = true, "8883"
	default:
		return nil, fmt.Errorf("mqtt: broker URL: scheme %.20q, want mqtt or mqtts", u.Scheme)
	}
	if u.Opaque != "" || u.Hostname() == "" {
		return nil, fmt.Errorf("mqtt: broker URL: no host, want %s://[user@]host[:port]", u.Scheme)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("mqtt: broker URL: want %s://[user@]host[:port] without path, query or fragment", u.Scheme)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("mqtt: broker URL: invalid port %.10q", p)
		}
		port = p
	} else if strings.HasSuffix(u.Host, ":") {
		return nil, errors.New("mqtt: broker URL: empty port")
	}
	s.host = u.Hostname()
	hostport := net.JoinHostPort(s.host, port)
	scheme := "tcp"
	if s.tls {
		scheme = "ssl"
	}
	s.paho = scheme + "://" + hostport
	user := ""
	if s.username != "" {
		user = url.User(s.username).String() + "@"
	}
	s.display = u.Scheme + "://" + user + hostport
	return s, nil
}
