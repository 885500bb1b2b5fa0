package relay

// ValidateDestinationName reports whether name may be a Destination.Name, with
// the error Destination.Validate gives for it (wrapping ErrInvalidDestination).
// Operator tools (package admin, the CLI) check a name with it before any SQL.
func ValidateDestinationName(name string) error {
	if destinationName.MatchString(name) {
		return nil
	}
	d := Destination{Name: name}
	return d.Validate() // the name's error alone: Validate checks it first
}
