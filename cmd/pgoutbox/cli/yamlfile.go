package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The strict reading of the CLI's YAML files (--tenants-file,
// --destinations-file): bounded in bytes and nodes before anything is built,
// no anchors or aliases (a few bytes standing for a tree of any size), no
// custom tags, one document, unknown and repeated keys refused, and errors
// with line numbers that never quote a value (it may hold a secret).

// readYAMLFile reads path, at most maxBytes of it; flag names the file's flag
// in errors. ctx (SIGTERM) ends the reading.
func readYAMLFile(ctx context.Context, flag, path string, maxBytes int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usagef("%s: %v", flag, err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, int64(maxBytes)+1))
	if err != nil {
		return nil, usagef("%s: %v", flag, err)
	}
	if len(raw) > maxBytes {
		return nil, usagef("%s %s is larger than its limit of %d bytes", flag, path, maxBytes)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return raw, nil
}

// parseYAMLFile parses raw as one YAML document of at most maxNodes nodes,
// checked by checkYAMLTree, and returns its root; nil when the document is
// empty (or null). Its errors quote no value.
func parseYAMLFile(raw []byte, maxNodes int) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var doc yaml.Node
	// Decoding into a yaml.Node builds the parse tree only: aliases stay
	// references to their anchor, nothing is expanded.
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, errors.New(yamlErrorText(err))
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, errors.New("holds more than one YAML document (---)")
	}
	if err := checkYAMLTree(&doc, maxNodes); err != nil {
		return nil, err
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil
	}
	return root, nil
}

// checkYAMLTree walks the whole tree (without recursion: the depth is the
// file's) and refuses anchors, aliases, custom tags, and more nodes than
// maxNodes.
func checkYAMLTree(doc *yaml.Node, maxNodes int) error {
	stack := []*yaml.Node{doc}
	for seen := 0; len(stack) > 0; seen++ {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		switch {
		case seen >= maxNodes:
			return fmt.Errorf("holds more than %d YAML nodes", maxNodes)
		case n.Kind == yaml.AliasNode || n.Anchor != "":
			return fmt.Errorf("line %d: YAML anchors and aliases (& and *) are not accepted: write each value out", n.Line)
		case strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!"):
			return fmt.Errorf("line %d: custom YAML tags are not accepted", n.Line)
		}
		stack = append(stack, n.Content...)
	}
	return nil
}

// eachKey calls f for each key of the mapping n, in order, refusing a key
// that is not one of keys or that repeats one before it.
func eachKey(n *yaml.Node, where string, keys []string, f func(key string, v *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: %s must be a map of %s", n.Line, where, strings.Join(keys, ", "))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		known := k.Kind == yaml.ScalarNode && slices.Contains(keys, k.Value)
		switch {
		case !known:
			return fmt.Errorf("line %d: %s: unknown key %s (want %s)", k.Line, where, shownKey(k), strings.Join(keys, ", "))
		case seen[k.Value]:
			return fmt.Errorf("line %d: %s: key %s is repeated", k.Line, where, k.Value)
		}
		seen[k.Value] = true
		if err := f(k.Value, v); err != nil {
			return err
		}
	}
	return nil
}

// keyShape is what an unknown key must look like to be shown: a mistyped key
// name, not a value written where a key goes (a URL, a password).
var keyShape = regexp.MustCompile(`^[a-z_]{1,32}$`)

// shownKey names an unknown key in an error.
func shownKey(k *yaml.Node) string {
	if k.Kind == yaml.ScalarNode && keyShape.MatchString(k.Value) {
		return k.Value
	}
	return "(not shown)"
}

// maxYAMLError bounds the text kept of the YAML parser's error.
const maxYAMLError = 200

// yamlErrorText keeps a YAML syntax error's position and problem, bounded,
// and drops anything it quotes (a value, which may hold a password).
func yamlErrorText(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if i := strings.IndexAny(msg, "`\"'"); i >= 0 {
		msg = strings.TrimSpace(msg[:i]) + " (value not shown)"
	}
	if len(msg) > maxYAMLError {
		msg = strings.ToValidUTF8(msg[:maxYAMLError], "") + "…"
	}
	return msg
}
