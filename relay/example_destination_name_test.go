package relay_test

import (
	"errors"
	"fmt"

	"github.com/pgoutbox/pgoutbox/relay"
)

// An operator tool checks a destination's name before it reaches any SQL.
func ExampleValidateDestinationName() {
	for _, name := range []string{"analytics", "Analytics", "a'; DROP TABLE x; --"} {
		err := relay.ValidateDestinationName(name)
		fmt.Printf("%q: valid %t, ErrInvalidDestination %t\n", name, err == nil, errors.Is(err, relay.ErrInvalidDestination))
	}
	// Output:
	// "analytics": valid true, ErrInvalidDestination false
	// "Analytics": valid false, ErrInvalidDestination true
	// "a'; DROP TABLE x; --": valid false, ErrInvalidDestination true
}
