package migrate

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Placeholders a migration file may use. They are expanded by a small SQL lexer,
// never by text replacement, so that the schema name is quoted for the exact
// context it lands in:
//
//   - {{schema}} in SQL code becomes the quoted identifier ("my schema"), and
//     {{schema_name}} the string literal ('my schema', or E'...' when the name
//     holds a backslash, which reads the same whatever standard_conforming_strings
//     is).
//   - Inside a dollar-quoted body ($fn$ ... $fn$, a function or DO body) the
//     body is SQL or PL/pgSQL code, lexed the same way: placeholders in its code
//     are expanded as above, and the body's tag is then changed, when needed, to
//     one that occurs nowhere in the expanded body, so a name holding "$fn$"
//     stays inside its quoted identifier or literal instead of ending the body.
//     Nested dollar quotes are handled the same way, level by level.
//   - In a comment a placeholder is left as written: a name holding a newline
//     would otherwise end a "--" comment.
//   - Inside a quoted string ('...') or a quoted identifier ("...") a placeholder
//     is an error of the migration file: a name pasted there would not be quoted.
//     Write {{schema_name}} as the whole literal instead, and build text at run
//     time with format('%I', v_schema) / format('%L', ...) or quote_ident.
//
// Any other {{...}} in code is an error too. All checks every embedded file at
// start, so a mistake in a migration file fails every test, not a deployment.
const (
	placeholderSchema     = "{{schema}}"
	placeholderSchemaName = "{{schema_name}}"
)

// expand returns src with its placeholders expanded for schema (see above).
func expand(src, schema string) (string, error) {
	ident := pgx.Identifier{schema}.Sanitize()
	lit := quoteLiteral(schema)
	var b strings.Builder
	if err := expandCode(&b, src, ident, lit, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

// quoteLiteral quotes s as a SQL string literal that means s whatever the
// session's standard_conforming_strings: E'...' with doubled backslashes when s
// holds a backslash, '...' otherwise (PostgreSQL's quote_literal does the same).
func quoteLiteral(s string) string {
	q := strings.ReplaceAll(s, "'", "''")
	if strings.Contains(q, `\`) {
		return "E'" + strings.ReplaceAll(q, `\`, `\\`) + "'"
	}
	return "'" + q + "'"
}

const maxBodyDepth = 8

// expandCode copies SQL code src to b, expanding placeholders in code and in
// dollar-quoted bodies (recursively), leaving comments alone and refusing
// placeholders inside quoted strings and identifiers.
func expandCode(b *strings.Builder, src, ident, lit string, depth int) error {
	if depth > maxBodyDepth {
		return fmt.Errorf("dollar quotes nested more than %d deep", maxBodyDepth)
	}
	i := 0
	for i < len(src) {
		c := src[i]
		switch {
		case strings.HasPrefix(src[i:], "--"):
			end := strings.IndexByte(src[i:], '\n')
			if end < 0 {
				end = len(src) - i
			}
			b.WriteString(src[i : i+end])
			i += end
		case strings.HasPrefix(src[i:], "/*"):
			end, err := blockCommentEnd(src, i)
			if err != nil {
				return err
			}
			b.WriteString(src[i:end])
			i = end
		case c == '\'':
			escapes := i > 0 && (src[i-1] == 'E' || src[i-1] == 'e') && (i < 2 || !isIdentChar(src[i-2]))
			end, err := quotedEnd(src, i, '\'', escapes)
			if err != nil {
				return err
			}
			if strings.Contains(src[i:end], "{{schema") {
				return fmt.Errorf("placeholder inside a string literal %.40q: use {{schema_name}} as the whole literal, or format('%%I'/'%%L') at run time", src[i:end])
			}
			b.WriteString(src[i:end])
			i = end
		case c == '"':
			end, err := quotedEnd(src, i, '"', false)
			if err != nil {
				return err
			}
			if strings.Contains(src[i:end], "{{schema") {
				return fmt.Errorf("placeholder inside a quoted identifier %.40q: write {{schema}} alone, it is quoted", src[i:end])
			}
			b.WriteString(src[i:end])
			i = end
		case c == '$' && (i == 0 || !isIdentChar(src[i-1])):
			tag, ok := dollarTag(src[i:])
			if !ok { // a parameter ($1) or a lone $
				b.WriteByte(c)
				i++
				continue
			}
			bodyStart := i + len(tag)
			n := strings.Index(src[bodyStart:], tag)
			if n < 0 {
				return fmt.Errorf("unterminated dollar quote %s", tag)
			}
			var body strings.Builder
			if err := expandCode(&body, src[bodyStart:bodyStart+n], ident, lit, depth+1); err != nil {
				return fmt.Errorf("in %s body: %w", tag, err)
			}
			t := freeTag(tag, body.String())
			b.WriteString(t)
			b.WriteString(body.String())
			b.WriteString(t)
			i = bodyStart + n + len(tag)
		case strings.HasPrefix(src[i:], placeholderSchemaName):
			b.WriteString(lit)
			i += len(placeholderSchemaName)
		case strings.HasPrefix(src[i:], placeholderSchema):
			b.WriteString(ident)
			i += len(placeholderSchema)
		case strings.HasPrefix(src[i:], "{{"):
			end := strings.Index(src[i:], "}}")
			if end < 0 {
				end = len(src) - i - 2
			}
			return fmt.Errorf("unknown placeholder %.40q (want %s or %s)", src[i:i+end+2], placeholderSchema, placeholderSchemaName)
		default:
			b.WriteByte(c)
			i++
		}
	}
	return nil
}

func isIdentChar(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')
}

// dollarTag returns the dollar-quote opening tag ($$ or $tag$) at the start of s.
func dollarTag(s string) (string, bool) {
	for j := 1; j < len(s); j++ {
		c := s[j]
		switch {
		case c == '$':
			return s[:j+1], true
		case c == '_' || c >= 0x80 || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z'):
		case '0' <= c && c <= '9' && j > 1:
		default:
			return "", false
		}
	}
	return "", false
}

// freeTag returns tag, or a variant of it, that cannot end early in body: the
// first occurrence of the tag in body+tag is the closing one.
func freeTag(tag, body string) string {
	base := strings.Trim(tag, "$")
	t := tag
	for n := 1; strings.Index(body+t, t) != len(body); n++ {
		t = "$" + base + "_q" + strconv.Itoa(n) + "$"
	}
	return t
}

// quotedEnd returns the index just past the quoted token starting at src[start]
// (a doubled quote character is part of it; with escapes, so is a
// backslash-escaped character).
func quotedEnd(src string, start int, q byte, escapes bool) (int, error) {
	for j := start + 1; j < len(src); j++ {
		switch {
		case escapes && src[j] == '\\':
			j++
		case src[j] == q:
			if j+1 < len(src) && src[j+1] == q {
				j++
				continue
			}
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated quote %.40q", src[start:])
}

// blockCommentEnd returns the index just past the (nestable) block comment at start.
func blockCommentEnd(src string, start int) (int, error) {
	depth := 0
	for j := start; j+1 < len(src); j++ {
		switch {
		case src[j] == '/' && src[j+1] == '*':
			depth++
			j++
		case src[j] == '*' && src[j+1] == '/':
			depth--
			j++
			if depth == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("unterminated block comment %.40q", src[start:])
}
