package redact

import (
	"errors"
	"strings"
)

// ErrInvalidConnString is wrapped by the errors of ConnStringError.
var ErrInvalidConnString = errors.New("invalid database URL")

// ConnStringError is the error to show for a connection string that failed to
// parse: it names where the value came from (a flag, an environment variable,
// an entry of a file) and what kind of problem the parser found, and nothing of
// the value itself. A string that does not parse cannot be split reliably into
// its secret and non-secret parts (a password with a space, "password = x"
// with spaces around '=', a signing secret put in the wrong variable), so
// none of it is quoted, not even redacted. err is the parser's error: only a
// fixed description chosen by its text is kept, never its text, and the
// result does not unwrap to it.
func ConnStringError(source string, err error) error {
	return &connStringError{source: source, reason: connStringReason(err)}
}

type connStringError struct{ source, reason string }

func (e *connStringError) Error() string {
	return e.source + ": " + ErrInvalidConnString.Error() + ": " + e.reason + " (the value is not shown: it may hold a password)"
}

func (e *connStringError) Unwrap() error { return ErrInvalidConnString }

// connStringReasons are the problems pgx's parser reports, as the message that
// follows the connection string it quotes ("cannot parse `…`: invalid port"),
// and the description shown for each: the only part of its error that is kept.
var connStringReasons = []struct{ match, show string }{
	{"failed to parse as URL", "not a valid URL"},
	{"failed to parse as keyword/value", "not a valid URL or key=value list"},
	{"failed to read service", "the service file cannot be read"},
	{"invalid sslcertmode", "invalid sslcertmode"},
	{"invalid connect_timeout", "invalid connect_timeout"},
	{"could not match", "the numbers of hosts and ports differ"},
	{"invalid port", "invalid port"},
	{"failed to configure TLS", "invalid TLS settings (sslmode, sslrootcert, sslcert, sslkey, …)"},
	{"unknown target_session_attrs value", "invalid target_session_attrs"},
	{"invalid min_protocol_version", "invalid min_protocol_version"},
	{"invalid max_protocol_version", "invalid max_protocol_version"},
	{"min_protocol_version cannot be greater", "min_protocol_version above max_protocol_version"},
	{"unknown channel_binding value", "invalid channel_binding"},
	{"invalid require_auth", "invalid require_auth"},
	{"cannot parse statement_cache_capacity", "invalid statement_cache_capacity"},
	{"cannot parse description_cache_capacity", "invalid description_cache_capacity"},
	{"invalid default_query_exec_mode", "invalid default_query_exec_mode"},
	{"cannot parse pool_", "invalid pool_* setting"},
	{"pool_max_conns too small", "pool_max_conns too small"},
}

// connStringReason picks the description of err from connStringReasons.
func connStringReason(err error) string {
	if err != nil {
		msg := err.Error()
		for _, r := range connStringReasons {
			if strings.Contains(msg, "`: "+r.match) {
				return r.show
			}
		}
	}
	return "not a URL or key=value connection string"
}
