package redact

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connStringOutputs is every text ConnStringError can produce for source.
func connStringOutputs(source string) map[string]bool {
	out := map[string]bool{}
	for _, r := range connStringReasons {
		out[(&connStringError{source, r.show}).Error()] = true
	}
	out[(&connStringError{source, connStringReason(nil)}).Error()] = true
	return out
}

// Connection strings pgx refuses, each holding the secret where a value the
// parser could not split would leave it: the error names the source and the
// problem, never the value.
func TestConnStringErrorQuotesNothing(t *testing.T) {
	const secret = "s3cr3t-PW"
	for _, form := range []string{
		"%s",                                       // url_env naming the webhook secret
		"PGOUTBOX-webhook-%s-0123456789abcdef",     // a secret-looking token
		"postgres://app:%s@db:99999/app",           // a password and a bad port
		"postgres://app:pa ss%s@db/app",            // a password with a space
		"postgres://app:%s%%zz@db/app",             // a bad escape in the password
		"host = db port = x password = %s",         // key = value with spaces, bad port
		"host=db password = '%s",                   // unterminated quote
		"host=db password=%s sslmode=nonsense",     // bad TLS setting
		"host=a,b port=1,2,3 password=%s",          // hosts and ports differ
		"host=db password=%s connect_timeout=soon", // bad timeout
		"postgres://db/app?password=%s&target_session_attrs=%s",
		"host=db password=%s pool_max_conns=many",
	} {
		s := strings.ReplaceAll(form, "%s", secret)
		_, err := pgx.ParseConfig(s)
		if err == nil {
			_, err = pgxpool.ParseConfig(s)
		}
		if err == nil {
			t.Errorf("%q: parsed", form)
			continue
		}
		got := ConnStringError("DATABASE_URL", err)
		if msg := got.Error(); strings.Contains(msg, "s3cr3t") || !connStringOutputs("DATABASE_URL")[msg] {
			t.Errorf("%q: %q quotes the value or is not one of the fixed texts", form, msg)
		}
		if !errors.Is(got, ErrInvalidConnString) || errors.Unwrap(got) != ErrInvalidConnString {
			t.Errorf("%q: %v does not wrap ErrInvalidConnString alone", form, got)
		}
		t.Logf("%-50q → %s", form, got)
	}
}

// Whatever pgx fails to parse, ConnStringError's text is one of a fixed set:
// nothing of the value can be in it.
func FuzzConnStringError(f *testing.F) {
	for _, s := range []string{"host=db password = 's3cr3t", "postgres://u:s3cr3t@h:0/x", "s3cr3t", "host=a,b port=1,2,3",
		"postgres://u@h/x?sslmode=s3cr3t", "postgres://[::1", "host=h port=x", "host=h pool_max_conns=0"} {
		f.Add(s)
	}
	outputs := connStringOutputs("PG_URL")
	f.Fuzz(func(t *testing.T, s string) {
		_, err := pgxpool.ParseConfig(s)
		if err == nil {
			return
		}
		if msg := ConnStringError("PG_URL", err).Error(); !outputs[msg] {
			t.Fatalf("ConnStringError for %q: %q is not a fixed text", s, msg)
		}
	})
}

func ExampleConnStringError() {
	_, err := pgx.ParseConfig("host=db port=x password = s3cr3t")
	fmt.Println(ConnStringError("DATABASE_URL", err))
	// Output: DATABASE_URL: invalid database URL: invalid port (the value is not shown: it may hold a password)
}
