package adminhttp_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/pgoutbox/pgoutbox/admin/adminhttp"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrate"
)

// A service mounts the console under /console in its own mux. Users come from a
// file (adminhttp.LoadUsers) or, as here, from text; viewers read, operators act.
func ExampleNew() {
	ctx := context.Background()
	pool, schema, done := pgtest.ExampleDB(ctx) // your DATABASE_URL, an outbox schema
	defer done()

	// A generated token: at least 32 characters (openssl rand -hex 16). Or a
	// bcrypt hash of a password, as pgoutbox console hash-password prints it.
	token := rand.Text() + rand.Text()
	users, err := adminhttp.ParseUsers(strings.NewReader("ops operator " + token + "\n"))
	if err != nil {
		log.Fatal(err)
	}
	// The tenants shown: names and globs, parsed where they come in (a flag).
	tenants, err := migrate.ParseSelector(schema)
	if err != nil {
		log.Fatal(err)
	}
	console, err := adminhttp.New(pool, &adminhttp.Config{Schemas: tenants, Users: users, BasePath: "/console"})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", console))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, bearer := range []string{"", token} {
		req, _ := http.NewRequest("GET", srv.URL+"/console/", nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		res.Body.Close()
		fmt.Println(res.Status)
	}
	// Output:
	// 401 Unauthorized
	// 200 OK
}
