package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/pgoutbox/pgoutbox/migrate"
	"github.com/pgoutbox/pgoutbox/relay"
)

// tenantsFile is the --tenants-file format (docs/operations.md, "Many
// tenants").
type tenantsFile struct {
	Databases []tenantsFileDB
}

type tenantsFileDB struct {
	Name string
	// URL or URLEnv (the name of an environment variable holding it).
	URL    string
	URLEnv string
	// Schemas is parsed as it is read: the zero Selector (no schemas, or an
	// empty value) serves every outbox schema of the database.
	Schemas      migrate.Selector
	TenantPrefix string
	MaxConns     int
	// TenantOwner names the roles trusted to own this database's tenants,
	// besides --tenant-owner's (migrate.ParseOwners).
	TenantOwner migrate.Trust
}

// Bounds of the --tenants-file. The file is read as a YAML tree and checked
// node by node before anything is built from it: its size bounds the work
// and the memory, since anchors and aliases, which let a few bytes stand for
// a tree of any size, are refused.
const (
	maxTenantsFile          = 1 << 20 // bytes
	maxTenantsFileNodes     = 50_000  // YAML nodes: keys, values, lists, maps
	maxTenantsFileDatabases = 1000    // as relay.GroupConfig's Databases
	maxTenantsFileValue     = 4096    // bytes of one value
	maxTenantsFileMaxConns  = 10_000
	maxTenantsFileName      = 100 // bytes of a database's name (logs, /readyz)
)

// tenantsFileKeys are the keys of a databases[] entry.
var tenantsFileKeys = []string{"name", "url", "url_env", "schemas", "tenant_prefix", "max_conns", "tenant_owner"}

// envName is the shape of url_env: the name of an environment variable,
// which errors show.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// readTenantsFile reads and checks path. Errors name the file, the entry and
// the key, and the line, never a value (a URL may hold a password); each is
// one bounded line. ctx (SIGTERM) ends the reading.
func readTenantsFile(ctx context.Context, path string) (*tenantsFile, error) {
	raw, err := readYAMLFile(ctx, "--tenants-file", path, maxTenantsFile)
	if err != nil {
		return nil, err
	}
	tf, err := parseTenantsFile(raw)
	if err != nil {
		return nil, usagef("--tenants-file %s: %w", path, err)
	}
	for i, d := range tf.Databases {
		if d.URLEnv != "" && os.Getenv(d.URLEnv) == "" {
			return nil, usagef("--tenants-file %s: databases[%d]: url_env %s is not set", path, i, d.URLEnv)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("--tenants-file %s: %w", path, err)
	}
	return tf, nil
}

// parseTenantsFile parses the YAML of a tenants file, refusing anchors and
// aliases, custom tags, more than one document, unknown and repeated keys,
// and every value out of its bounds. Its errors quote no value.
func parseTenantsFile(raw []byte) (*tenantsFile, error) {
	root, err := parseYAMLFile(raw, maxTenantsFileNodes)
	if err != nil {
		return nil, err
	}
	if root == nil {
		return nil, errors.New("lists no databases (want a 'databases:' list)")
	}
	tf := &tenantsFile{}
	err = eachKey(root, "the file", []string{"databases"}, func(_ string, v *yaml.Node) error {
		if v.Kind != yaml.SequenceNode {
			return fmt.Errorf("line %d: databases must be a list", v.Line)
		}
		if len(v.Content) > maxTenantsFileDatabases {
			return fmt.Errorf("line %d: databases lists %d entries, above the limit of %d", v.Line, len(v.Content), maxTenantsFileDatabases)
		}
		for i, e := range v.Content {
			d, err := parseTenantsFileDB(e, fmt.Sprintf("databases[%d]", i))
			if err != nil {
				return err
			}
			tf.Databases = append(tf.Databases, d)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(tf.Databases) == 0 {
		return nil, errors.New("lists no databases (want a 'databases:' list)")
	}
	return tf, nil
}

// parseTenantsFileDB reads one entry of databases.
func parseTenantsFileDB(n *yaml.Node, where string) (tenantsFileDB, error) {
	var d tenantsFileDB
	err := eachKey(n, where, tenantsFileKeys, func(key string, v *yaml.Node) error {
		if v.Kind != yaml.ScalarNode {
			return fmt.Errorf("line %d: %s.%s must be a single value", v.Line, where, key)
		}
		if len(v.Value) > maxTenantsFileValue {
			return fmt.Errorf("line %d: %s.%s is longer than its limit of %d bytes", v.Line, where, key, maxTenantsFileValue)
		}
		value := v.Value
		if v.Tag == "!!null" {
			value = ""
		}
		switch key {
		case "name":
			d.Name = value
		case "url":
			d.URL = value
		case "url_env":
			if value != "" && !envName.MatchString(value) {
				return fmt.Errorf("line %d: %s.url_env must be the name of an environment variable (letters, digits and '_')", v.Line, where)
			}
			d.URLEnv = value
		case "schemas":
			sel, err := parseSelector(fmt.Sprintf("line %d: %s.schemas", v.Line, where), value)
			if err != nil {
				return err
			}
			d.Schemas = sel
		case "tenant_prefix":
			d.TenantPrefix = value
		case "max_conns":
			m, err := strconv.Atoi(value)
			if err != nil || m < 0 || m > maxTenantsFileMaxConns {
				return fmt.Errorf("line %d: %s.max_conns must be a whole number from 1 to %d (0 or none: --db-max-conns)", v.Line, where, maxTenantsFileMaxConns)
			}
			d.MaxConns = m
		case "tenant_owner":
			// ParseOwners' own error would quote a role name.
			t, err := migrate.ParseOwners(value)
			if err != nil {
				return fmt.Errorf("line %d: %s.tenant_owner must be a comma list of at most %d role names (each printable, at most 63 bytes, not public, none or pg_*)",
					v.Line, where, migrate.MaxTrustedOwners)
			}
			d.TenantOwner = t
		}
		return nil
	})
	if err != nil {
		return d, err
	}
	if (d.URL == "") == (d.URLEnv == "") {
		return d, fmt.Errorf("line %d: %s: set exactly one of url and url_env", n.Line, where)
	}
	// The checks' own errors would quote the value: these name the rule.
	if d.TenantPrefix != "" && relay.ValidateTenant(d.TenantPrefix) != nil {
		return d, fmt.Errorf("line %d: %s.tenant_prefix must be letters, digits, '_' and '-' only", n.Line, where)
	}
	if strings.IndexFunc(d.Name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 || len(d.Name) > maxTenantsFileName {
		return d, fmt.Errorf("line %d: %s.name must be at most %d printable characters", n.Line, where, maxTenantsFileName)
	}
	return d, nil
}
