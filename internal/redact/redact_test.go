package redact

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// secretForms are connection strings and texts with one secret (%[1]s) planted
// where each form keeps it. Every one must come out without it.
var secretForms = []string{
	"postgres://app:%[1]s@db.example:5432/app",
	"postgresql://app:%[1]s@db.example/app?sslmode=require",
	"postgres://app:%[1]s@h1:5432,h2:5433/app?target_session_attrs=read-write",
	"postgres://app@db.example/app?password=%[1]s",
	"postgres://app@db.example/app?sslmode=verify-full&sslpassword=%[1]s",
	"postgres:///app?host=/tmp&password=%[1]s",
	"host=db.example user=app password=%[1]s dbname=app",
	"host=db.example password='%[1]s' dbname=app",
	"host=db.example password = %[1]s",
	"user=app sslpassword=%[1]s sslkey=/k",
	"amqp://guest:%[1]s@127.0.0.1:5672/vhost",
	"amqps://guest:%[1]s@mq.example:5671/",
	"nats://user:%[1]s@127.0.0.1:4222",
	"nats://%[1]s@127.0.0.1:4222",
	"tls://%[1]s@nats.example:4222",
	"nats://a:b@h1:4222,nats://u:%[1]s@h2:4222",
	"nats://h1:4222, nats://%[1]s@h2:4222",
	"kafka://user:%[1]s@k1:9092,k2:9092?sasl=scram-sha-256&tls=true",
	"https://user:%[1]s@hooks.example/outbox/{aggregate_type}",
	"http://%[1]s@hooks.example/outbox",
	"https://hooks.example/outbox?token=%[1]s",
	"https://hooks.example/outbox?a=1&access_token=%[1]s&b=2",
	"https://hooks.example/outbox?sig=%[1]s",
	"https://hooks.example/outbox?X-Amz-Signature=%[1]s&X-Amz-Credential=c",
	"https://hooks.example/outbox?api_key=%[1]s",
	"https://hooks.example/outbox?client_secret=%[1]s",
	"https://hooks.example/outbox;token=%[1]s",
	"https://hooks.example/cb#access_token=%[1]s&state=x",
	"https://hooks.example/outbox?key=%[1]s",
	"ws://u:%[1]s@nats.example:8080",
	"redis://:%[1]s@cache:6379/0",
	"connect to postgres://app:%[1]s@db:5432/app: connection refused",
	`dial "amqp://guest:%[1]s@mq:5672/": i/o timeout`,
	"error: url=(https://u:%[1]s@h/x) failed",
	`{"error":"bad","password":"%[1]s"}`,
	`{"headers":{"Authorization":["Basic %[1]s"]}}`,
	`{"Authorization": "Bearer %[1]s"}`,
	`{"api_key": "%[1]s", "ok": false}`,
	"Authorization: Bearer %[1]s",
	"authorization: Basic %[1]s\r\nHost: x",
	"Cookie: session=%[1]s",
	"Outbox-Signature: t=1,v1=%[1]s",
	"token=%[1]s",
	"secret: %[1]s",
	"PGPASSWORD=%[1]s",
	"got header X-Api-Key: %[1]s",
	"the password=\"%[1]s\" is wrong",
}

func randSecret(t testing.TB) string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "Sx" + hex.EncodeToString(b)
}

func TestTextHidesEveryForm(t *testing.T) {
	t.Parallel()
	for _, form := range secretForms {
		sec := randSecret(t)
		in := fmt.Sprintf(form, sec)
		for name, out := range map[string]string{"Text": Text(in), "URL": URL(in)} {
			if strings.Contains(out, sec) {
				t.Errorf("%s(%q) = %q: the secret is still there", name, in, out)
			}
			if out == in {
				t.Errorf("%s(%q) changed nothing", name, in)
			}
		}
	}
}

// The parts that are not secret stay, so the display still says where.
func TestURLKeepsTheRest(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://app:pw@db.example:5432/app?sslmode=require":     "postgres://app:xxxxx@db.example:5432/app?sslmode=require",
		"postgres://app@db.example/app":                             "postgres://app@db.example/app",
		"postgres://postgres@127.0.0.1:5432/test?password=pw&x=1":   "postgres://postgres@127.0.0.1:5432/test?password=xxxxx&x=1",
		"nats://tok@127.0.0.1:4222":                                 "nats://xxxxx@127.0.0.1:4222",
		"nats://127.0.0.1:4222":                                     "nats://127.0.0.1:4222",
		"nats://a:b@h1:4222,nats://tok@h2:4222":                     "nats://a:xxxxx@h1:4222,nats://xxxxx@h2:4222",
		"kafka://u:p@k1:9092,k2:9092?sasl=plain":                    "kafka://u:xxxxx@k1:9092,k2:9092?sasl=plain",
		"amqp://guest:guest@127.0.0.1:5672/":                        "amqp://guest:xxxxx@127.0.0.1:5672/",
		"https://hooks.example/o/{aggregate_type}?token=t&v=2":      "https://hooks.example/o/{aggregate_type}?token=xxxxx&v=2",
		"https://u:p@hooks.example/o":                               "https://u:xxxxx@hooks.example/o",
		"host=db user=app password='a b' dbname=app":                "host=db user=app password=xxxxx dbname=app",
		"host=db user=app dbname=app":                               "host=db user=app dbname=app",
		"null://":                                                   "null://",
		"embedded":                                                  "embedded",
		"postgres://u:p%40ss@h/db":                                  "postgres://u:xxxxx@h/db",
		"postgres://u:p@ss@h/db":                                    "postgres://u:xxxxx@h/db",
		"postgres://u:p/ss@h/db":                                    "postgres://xxxxx@h/db",
		"https://hooks.example/users/@me":                           "https://xxxxx@me",
		"https://hooks.example/a?next=/b&password=p#access_token=t": "https://hooks.example/a?next=/b&password=xxxxx#access_token=xxxxx",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

// Known secrets go in every form they travel in: raw, escaped, base64 (basic auth).
func TestTextKnownSecrets(t *testing.T) {
	t.Parallel()
	sec := randSecret(t) + "/+= &"
	basic := base64.StdEncoding.EncodeToString([]byte("user:" + sec))
	for _, in := range []string{
		"echo: " + sec,
		"echo: " + url.QueryEscape(sec),
		"echo: " + url.PathEscape(sec),
		"echo: " + base64.StdEncoding.EncodeToString([]byte(sec)),
		"x-my-header=" + sec + " done",
		"auth " + basic,
	} {
		out := Text(in, sec, basic)
		for _, form := range []string{sec, url.QueryEscape(sec), base64.StdEncoding.EncodeToString([]byte(sec)), basic} {
			if strings.Contains(out, form) {
				t.Errorf("Text(%q) = %q still holds %q", in, out, form)
			}
		}
	}
	if got := Text("a ab abc", "a", "ab"); got != "a ab abc" {
		t.Errorf("secrets under 3 bytes are replaced everywhere: %q", got)
	}
}

func TestArgs(t *testing.T) {
	t.Parallel()
	sec := randSecret(t)
	in := []string{"relay", "--database-url", "postgres://u:" + sec + "@h/db", "--schema", "s",
		"--broker=nats://" + sec + "@h:4222", "--webhook-secret", sec, "--password=" + sec, "--token", sec,
		"--id", "r1", "--relay-arg=--database-url=postgres://u:" + sec + "@h/db", "https://h/x?token=" + sec}
	out := Args(in)
	if len(out) != len(in) {
		t.Fatalf("Args changed the count: %q", out)
	}
	joined := strings.Join(out, " ")
	if strings.Contains(joined, sec) {
		t.Errorf("Args(%q) = %q: the secret is still there", in, out)
	}
	for _, keep := range []string{"relay", "--schema", "s", "--id", "r1", "postgres://u:xxxxx@h/db", "--broker=nats://xxxxx@h:4222"} {
		if !strings.Contains(joined, keep) {
			t.Errorf("Args dropped %q: %q", keep, out)
		}
	}
}

func TestEnv(t *testing.T) {
	t.Parallel()
	sec := randSecret(t)
	for _, e := range []string{"DATABASE_URL=postgres://u:" + sec + "@h/db", "PGOUTBOX_BROKER=nats://" + sec + "@h",
		"PGOUTBOX_WEBHOOK_SECRET=" + sec, "PGPASSWORD=" + sec, "API_TOKEN=" + sec, "X=https://h/?sig=" + sec} {
		if out := Env(e); strings.Contains(out, sec) || !strings.Contains(out, "=") {
			t.Errorf("Env(%q) = %q", e, out)
		}
	}
	if got := Env("HOME=/root"); got != "HOME=/root" {
		t.Errorf("Env changed a plain variable: %q", got)
	}
}

func FuzzText(f *testing.F) {
	for i := range secretForms {
		f.Add(uint8(i), "S3cretValue")
	}
	f.Add(uint8(0), "p@ss:w/rd?#&=;")
	f.Add(uint8(3), "a%20b")
	f.Fuzz(func(t *testing.T, form uint8, raw string) {
		// No panic on anything.
		_ = Text(raw, raw)
		_ = URL(raw)
		_ = Args([]string{raw, "--database-url", raw})
		// A secret in a form that keeps it as one token: never shown.
		var b strings.Builder
		for _, c := range raw {
			if ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') || c == '.' || c == '_' || c == '~' {
				b.WriteRune(c)
			}
		}
		sec := "Sx9q" + b.String()
		in := fmt.Sprintf(secretForms[int(form)%len(secretForms)], sec)
		if out := Text(in); strings.Contains(out, sec) {
			t.Errorf("Text(%q) = %q", in, out)
		}
		if out := Text("echo "+raw+" "+sec, sec); strings.Contains(out, sec) {
			t.Errorf("known secret %q survived: %q", sec, out)
		}
	})
}

func TestSecrets(t *testing.T) {
	t.Parallel()
	for _, form := range secretForms[:31] { // the connection strings
		sec := randSecret(t)
		in := fmt.Sprintf(form, sec)
		got := Secrets(in)
		if !slices.Contains(got, sec) {
			t.Errorf("Secrets(%q) = %q, want it to hold %q", in, got, sec)
		}
		if out := Text("server said: "+sec, got...); strings.Contains(out, sec) {
			t.Errorf("Text with Secrets(%q) = %q", in, out)
		}
	}
	if got := Secrets("postgres://postgres@127.0.0.1/test", "null://", "nats://127.0.0.1:4222"); len(got) != 0 {
		t.Errorf("Secrets of URLs without any = %q", got)
	}
}

// BenchmarkText measures the scrub of an error message, a body of plain text and a
// receiver's echo of request headers.
func BenchmarkText(b *testing.B) {
	echo := `{"headers":{"Authorization":["Basic aG9vazpabHFhYmNkZWZnaGlqa2xtbm9w"],"Content-Type":["application/json"],` +
		`"Outbox-Signature":["t=1764770000,v1=5d41402abc4b2a76b9719d911017c592"]},"url":"/outbox?token=Zqabcdef"}`
	for name, s := range map[string]string{
		"error": "webhook: POST event 01a23c55-36ba-7000-9ee6-d557b43ed1ad to http://127.0.0.1:42767: 500 Internal Server Error",
		"plain": strings.Repeat("the receiver could not process the event. ", 100),
		"echo":  strings.Repeat(echo, 4),
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				Text(s, "abcdefgh", "ijklmnop")
			}
		})
	}
}

func TestEndpoint(t *testing.T) {
	const secret = "Zq7-secret"
	for _, tc := range []struct {
		in        string
		keepQuery bool
		want      string
	}{
		{"nats://u:" + secret + "@h:4222", false, "nats://xxxxx@h:4222"},
		{"nats://" + secret + "@h:4222", false, "nats://xxxxx@h:4222"},
		{"amqp://" + secret + ":@h", false, "amqp://xxxxx@h"},
		{"tls://u:p@ss" + secret + "@h", false, "tls://xxxxx@h"},
		{"nats://u:" + secret + "@a:4222,nats://u:" + secret + "@b:4222", false, "nats://xxxxx@b:4222"},
		{"https://h/hook?token=" + secret, false, "https://h/hook?…"},
		{"http://h/hook#" + secret, false, "http://h/hook?…"},
		{"kafka://u:pa," + secret + "@b1:9092?sasl=plain", true, "kafka://xxxxx@b1:9092?sasl=plain"},
		{"https://h/p", false, "https://h/p"},
		{"no-scheme-" + secret, false, ""},
		{"://" + secret, false, ""},
	} {
		got := Endpoint(tc.in, tc.keepQuery)
		if got != tc.want {
			t.Errorf("Endpoint(%q, %v) = %q, want %q", tc.in, tc.keepQuery, got, tc.want)
		}
		if strings.Contains(got, secret) {
			t.Errorf("Endpoint(%q) = %q shows the secret", tc.in, got)
		}
	}
}

// Header hides the values of headers named like secrets, and credentials in
// the values of any other header.
func TestHeader(t *testing.T) {
	t.Parallel()
	sec := "S3cr3t" + hex.EncodeToString([]byte("header-value"))
	jwt := "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
	for _, c := range []struct{ name, value string }{
		{"Authorization", "Bearer " + sec}, {"authorization", sec}, {"X-Api-Key", sec}, {"api_key", sec}, {"X-Auth-Token", sec},
		{"Cookie", "session=" + sec}, {"Set-Cookie", sec}, {"X-Hub-Signature-256", sec}, {"client_secret", sec},
		{"Password", sec}, {"DB_PASSWD", sec}, {"x-session-id", sec}, {"Proxy-Authorization", sec}, {"X-Amz-Security-Token", sec},
		{"private-key", sec}, {"jwt", sec}, {"X-Credential", sec}, {"x-bearer", sec},
		{"x-note", "Bearer " + sec}, {"x-note", "basic " + sec}, {"x-note", "token: " + sec},
		{"x-callback", "https://user:" + sec + "@hooks.example/cb"}, {"x-link", "https://hooks.example/cb?access_token=" + sec},
		{"x-link", "https://hooks.example/cb#access_token=" + sec + "&state=1"}, {"x-raw", "access_token=" + sec + "&x=1"},
		{"x-raw", "password=" + sec}, {"x-id", jwt}, {"x-forward", "for " + jwt + " ok"},
		{"callback_url", "https://u:" + sec + "@hooks.example/x"}, {"x-dsn", "host=db password=" + sec},
	} {
		shown, masked := Header(c.name, c.value)
		secret := sec
		if strings.Contains(c.value, jwt) {
			secret = jwt[40:]
		}
		if strings.Contains(shown, secret) || !masked {
			t.Errorf("Header(%q, %q) = %q, %v", c.name, c.value, shown, masked)
		}
	}
	for name, value := range map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"x-tenant": "acme", "content-type": "application/json", "x-callback": "https://hooks.example/cb?x=1", "x-note": "a basic idea",
		"idempotency-key": "order-42", "x-empty": ""} {
		if shown, masked := Header(name, value); shown != value || masked {
			t.Errorf("Header(%q, %q) = %q, %v: nothing to hide", name, value, shown, masked)
		}
	}
	if shown, _ := Header("x-callback", "https://user:"+sec+"@hooks.example/cb"); !strings.Contains(shown, "hooks.example") {
		t.Errorf("a URL's host is hidden: %q", shown)
	}
}
