package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"
)

// maxBody bounds every request body.
const maxBody = 64 << 10

// readBody reads the whole body, at most maxBody bytes.
func readBody(c echo.Context) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, maxBody+1))
	if err != nil {
		return nil, badRequest("could not read the request body")
	}
	if len(body) > maxBody {
		return nil, tooLarge()
	}
	return body, nil
}

// decodeJSON decodes exactly one JSON object into v: unknown fields, wrong
// types (null included), trailing data and an empty body are refused with a
// message saying which. A null is never read as "absent": a field is given
// with a value of its type, or left out.
func decodeJSON(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return badRequest(fmt.Sprintf("malformed JSON at byte %d", se.Offset))
		case errors.As(err, &te):
			if te.Field == "" {
				return badRequest("request body must be a JSON object")
			}
			return badRequest(fmt.Sprintf("field %q must be %s", te.Field, kind(te.Type.String())))
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return badRequest("unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field "))
		default:
			return badRequest("malformed JSON: " + err.Error())
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("request body must hold one JSON object and nothing after it")
	}
	if !bytes.Contains(body, []byte("null")) {
		return nil // the common case: no second pass
	}
	if path, ok := firstNull(body); ok {
		if path == "" {
			return badRequest("request body must be a JSON object")
		}
		return badRequest(fmt.Sprintf("field %q must not be null (leave it out, or give it a value)", path))
	}
	return nil
}

// firstNull finds the first null in a well-formed JSON document and names
// where it is ("items[0].qty"; "" for the document itself).
func firstNull(doc []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var stack []jsonLevel
	path := func() string {
		var b strings.Builder
		for _, l := range stack {
			if l.object {
				if b.Len() > 0 {
					b.WriteByte('.')
				}
				b.WriteString(l.key)
			} else {
				fmt.Fprintf(&b, "[%d]", l.index)
			}
		}
		return b.String()
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false // io.EOF, or malformed (the decoder has said so already)
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].want {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:n-1]
				valueDone(stack)
				continue
			}
			stack[n-1].key, stack[n-1].want = tok.(string), false
			continue
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{':
				stack = append(stack, jsonLevel{object: true, want: true})
			case '[':
				stack = append(stack, jsonLevel{})
			case ']':
				stack = stack[:len(stack)-1]
				valueDone(stack)
			}
		case nil:
			return path(), true
		default:
			valueDone(stack)
		}
	}
}

func kind(goType string) string {
	switch {
	case strings.Contains(goType, "int"):
		return "an integer"
	case goType == "string" || goType == "*string":
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	}
	return "of type " + goType
}

// bind reads and decodes the request body into v.
func bind(c echo.Context, v any) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	return decodeJSON(body, v)
}

// required refuses missing fields (pointers left nil by the decoder).
func required(fields map[string]bool) error {
	var missing []string
	for name, present := range fields {
		if !present {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return badRequest("missing required field(s): " + strings.Join(missing, ", "))
	}
	return nil
}

// jsonSerializer writes answers as Echo's default does, without escaping
// <, > and & (messages read "Bearer <admin token>", not "\u003c...").
type jsonSerializer struct{ echo.DefaultJSONSerializer }

func (jsonSerializer) Serialize(c echo.Context, v any, indent string) error {
	enc := json.NewEncoder(c.Response())
	enc.SetEscapeHTML(false)
	if indent != "" {
		enc.SetIndent("", indent)
	}
	return enc.Encode(v)
}

// jsonLevel is one container firstNull is inside.
type jsonLevel struct {
	object bool
	key    string // in an object: the member being read
	index  int    // in an array: the element being read
	want   bool   // in an object: the next token is a key
}

// valueDone moves the innermost container past the value just read.
func valueDone(stack []jsonLevel) {
	if n := len(stack); n > 0 {
		if stack[n-1].object {
			stack[n-1].want = true
		} else {
			stack[n-1].index++
		}
	}
}
