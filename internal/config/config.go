// Package config is the one way a package of pgoutbox turns the *Config a caller
// gives into the configuration it runs with: nil means all defaults, zero fields
// mean their documented defaults, and every problem is reported at once, each
// naming its field ("relay: Config.Lease (10ms) must be at least 1s").
//
// A package writes two functions, one that fills defaults and one that checks the
// filled config, and exposes them through Resolve:
//
//	func (c *Config) Validate() error { _, err := c.withDefaults(); return err }
//
//	func (c *Config) withDefaults() (Config, error) {
//		return config.Resolve("relay", c, fillDefaults, check)
//	}
package config

import (
	"errors"
	"fmt"
)

// Resolve returns a copy of *c (the zero C when c is nil) with fill's defaults,
// and the problems check finds in that copy, joined with errors.Join and each
// prefixed with pkg (the package's name). fill may be nil. c itself is never
// modified.
func Resolve[C any](pkg string, c *C, fill func(*C), check func(*C, *Problems)) (C, error) {
	var out C
	if c != nil {
		out = *c
	}
	if fill != nil {
		fill(&out)
	}
	p := &Problems{prefix: pkg + ": "}
	if check != nil {
		check(&out, p)
	}
	return out, p.Err()
}

// Default sets *v to def when *v is its type's zero value.
func Default[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Problems collects what is wrong with one configuration.
type Problems struct {
	prefix string
	errs   []error
}

// Check records the problem format describes (fmt.Errorf's verbs, %w included)
// unless ok. The text should start with the field's name ("Config.Workers (0)
// must be positive").
func (p *Problems) Check(ok bool, format string, args ...any) {
	if !ok {
		p.errs = append(p.errs, fmt.Errorf(p.prefix+format, args...))
	}
}

// Field records err, when it is not nil, as the problem of the named field; the
// result wraps err.
func (p *Problems) Field(field string, err error) {
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s%s: %w", p.prefix, field, err))
	}
}

// Err returns the problems recorded so far, joined, or nil.
func (p *Problems) Err() error { return errors.Join(p.errs...) }
