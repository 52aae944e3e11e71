package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/httpapi"
)

var httpMethods = []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}

// loadSpec parses openapi.yaml (the file the server embeds and serves).
func loadSpec(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile("openapi.yaml")
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &doc), "openapi.yaml parses")
	return doc
}

func mapAt(t *testing.T, v any, path ...string) map[string]any {
	t.Helper()
	for _, p := range path {
		m, ok := v.(map[string]any)
		require.True(t, ok, "%s: not a mapping", strings.Join(path, "."))
		v = m[p]
	}
	m, ok := v.(map[string]any)
	require.True(t, ok, "%s: not a mapping (%T)", strings.Join(path, "."), v)
	return m
}

// resolve follows a local "#/a/b" reference.
func resolve(doc map[string]any, ref string) (any, bool) {
	p, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, false
	}
	var v any = doc
	for _, part := range strings.Split(p, "/") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[strings.NewReplacer("~1", "/", "~0", "~").Replace(part)]; !ok {
			return nil, false
		}
	}
	return v, true
}

// deref returns v with a $ref followed (once per level, as OpenAPI 3.0 allows).
func deref(t *testing.T, doc map[string]any, v any) any {
	t.Helper()
	for range 10 {
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		ref, ok := m["$ref"].(string)
		if !ok {
			return v
		}
		v, ok = resolve(doc, ref)
		require.True(t, ok, "unresolved $ref %s", ref)
	}
	t.Fatal("$ref cycle")
	return nil
}

// The document parses as OpenAPI 3.0, every $ref resolves, every regular
// expression compiles, and every operation is well-formed.
func TestOpenAPIDocument(t *testing.T) {
	doc := loadSpec(t)
	require.Regexp(t, `^3\.0\.\d+$`, doc["openapi"])
	info := mapAt(t, doc, "info")
	require.NotEmpty(t, info["title"])
	require.NotEmpty(t, info["version"])

	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				switch k {
				case "$ref":
					ref, ok := x.(string)
					require.True(t, ok, "%s: $ref is not a string", where)
					_, ok = resolve(doc, ref)
					require.True(t, ok, "%s: unresolved $ref %s", where, ref)
				case "pattern":
					if s, ok := x.(string); ok {
						_, err := regexp.Compile(s)
						require.NoError(t, err, "%s: pattern", where)
					}
				}
				walk(where+"."+k, x)
			}
		case []any:
			for i, x := range v {
				walk(where+"["+strconv.Itoa(i)+"]", x)
			}
		}
	}
	walk("", doc)

	statusCode := map[string][]string{} // statusCodes, keyed as the document's responses are
	for status, codes := range statusCodes {
		statusCode[strconv.Itoa(status)] = codes
	}
	// The headers answers carry: X-Request-ID always, and per status.
	statusHeaders := map[string][]string{"201": {"Location"}, "401": {"WWW-Authenticate"}, "405": {"Allow"}, "429": {"Retry-After"}}
	checkHeaders := func(where, status string, r map[string]any) {
		headers := mapAt(t, r, "headers")
		require.Equal(t, "#/components/headers/RequestID", mapAt(t, headers, "X-Request-ID")["$ref"], "%s %s: X-Request-ID", where, status)
		for _, name := range statusHeaders[status] {
			h := mapAt(t, deref(t, doc, headers[name]))
			require.Equal(t, true, h["required"], "%s %s: header %s is required", where, status, name)
		}
	}
	for name, r := range mapAt(t, doc, "components", "responses") {
		checkHeaders("components.responses."+name, "", mapAt(t, r))
	}
	paths := mapAt(t, doc, "paths")
	require.NotEmpty(t, paths)
	for path, item := range paths {
		for method, op := range item.(map[string]any) {
			if !slices.Contains(httpMethods, method) {
				require.Contains(t, []string{"parameters", "summary", "description"}, method, "%s: unexpected key", path)
				continue
			}
			where := strings.ToUpper(method) + " " + path
			opm := mapAt(t, op)
			require.NotEmpty(t, opm["summary"], "%s: summary", where)
			responses := mapAt(t, opm, "responses")
			require.NotEmpty(t, responses, "%s: responses", where)
			success := 0
			for status, resp := range responses {
				require.Regexp(t, `^[1-5][0-9][0-9]$`, status, "%s: response key", where)
				r := mapAt(t, deref(t, doc, resp))
				require.NotEmpty(t, r["description"], "%s %s: description", where, status)
				checkHeaders(where, status, r)
				if status[0] == '2' {
					success++
					continue
				}
				codes, isError := statusCode[status]
				if !isError || path == "/readyz" {
					continue
				}
				media := mapAt(t, r, "content", "application/json")
				require.Equal(t, "#/components/schemas/Error", mapAt(t, media, "schema")["$ref"], "%s %s: error schema", where, status)
				var examples []any
				if ex, ok := media["example"]; ok {
					examples = append(examples, ex)
				}
				if exs, ok := media["examples"].(map[string]any); ok {
					for _, ex := range exs {
						examples = append(examples, mapAt(t, ex)["value"])
					}
				}
				for _, ex := range examples {
					require.Contains(t, codes, mapAt(t, ex, "error")["code"], "%s %s: example's code", where, status)
				}
			}
			require.Equal(t, 1, success, "%s: one success response", where)
		}
	}
}

// echoPath turns Echo's /v1/skus/:sku into OpenAPI's /v1/skus/{sku}.
func echoPath(p string) string {
	return regexp.MustCompile(`:([A-Za-z_][A-Za-z0-9_]*)`).ReplaceAllString(p, "{$1}")
}

// Every route the server registers is documented with the same method and
// path parameters, and the document describes no route the server lacks.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	doc := loadSpec(t)
	paths := mapAt(t, doc, "paths")
	s := httpapi.New(httpapi.Config{}, httpapi.Services{}, nil)

	registered := map[string]bool{}
	for _, r := range s.Echo().Routes() {
		path, method := echoPath(r.Path), strings.ToLower(r.Method)
		registered[method+" "+path] = true
		item, ok := paths[path].(map[string]any)
		require.True(t, ok, "route %s %s: path %s is not documented", r.Method, r.Path, path)
		op, ok := item[method].(map[string]any)
		require.True(t, ok, "route %s %s: method not documented for %s", r.Method, r.Path, path)

		// Path parameters: the template's names, each declared in: path, required.
		want := regexp.MustCompile(`\{([^}]+)\}`).FindAllStringSubmatch(path, -1)
		var declared []string
		for _, params := range []any{item["parameters"], op["parameters"]} {
			list, _ := params.([]any)
			for _, p := range list {
				pm := mapAt(t, deref(t, doc, p))
				if pm["in"] == "path" {
					require.Equal(t, true, pm["required"], "%s %s: path parameter %v must be required", r.Method, path, pm["name"])
					declared = append(declared, pm["name"].(string))
				}
			}
		}
		var names []string
		for _, m := range want {
			names = append(names, m[1])
		}
		sort.Strings(declared)
		sort.Strings(names)
		require.Equal(t, names, declared, "%s %s: path parameters", r.Method, path)
	}
	require.NotEmpty(t, registered)
	for path, item := range paths {
		for method := range item.(map[string]any) {
			if slices.Contains(httpMethods, method) {
				require.True(t, registered[method+" "+path], "documented %s %s is not a route", strings.ToUpper(method), path)
			}
		}
	}
}

// The server serves the document it embeds, byte for byte.
func TestOpenAPIServed(t *testing.T) {
	raw, err := os.ReadFile("openapi.yaml")
	require.NoError(t, err)
	s := httpapi.New(httpapi.Config{}, httpapi.Services{}, nil)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/openapi.yaml", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "application/yaml", rec.Header().Get("Content-Type"))
	body, _ := io.ReadAll(rec.Body)
	require.Equal(t, string(raw), string(body))
}

// The documented field patterns and bounds are the ones the service enforces.
func TestOpenAPIPatternsMatchValidation(t *testing.T) {
	doc := loadSpec(t)
	schemas := mapAt(t, doc, "components", "schemas")
	skuRe := regexp.MustCompile(mapAt(t, schemas, "SKUName")["pattern"].(string))
	tokenRe := regexp.MustCompile(mapAt(t, schemas, "Token")["pattern"].(string))
	require.Equal(t, `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`, skuRe.String())
	require.Equal(t, `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`, tokenRe.String())
	samples := []string{"", "a", "A-1", "a.b_c-d", "-a", ".a", "_a", "a:b", "a b", "a/b", "a{b}", "é", "a\n",
		strings.Repeat("x", 63), strings.Repeat("x", 64), strings.Repeat("x", 65),
		strings.Repeat("x", 127), strings.Repeat("x", 128), strings.Repeat("x", 129)}
	for _, s := range samples {
		require.Equal(t, skuRe.MatchString(s), inventory.ValidateSKU(s) == nil, "sku %q", s)
		require.Equal(t, tokenRe.MatchString(s), inventory.ValidateToken(s) == nil, "token %q", s)
	}
	qty := mapAt(t, schemas, "Qty")
	require.Equal(t, 1, qty["minimum"])
	require.EqualValues(t, inventory.DefaultMaxQty, qty["maximum"])
	require.Equal(t, "#/components/schemas/Qty", mapAt(t, schemas, "Item", "properties", "qty")["$ref"])
	deduct := mapAt(t, doc, "paths", "/v1/stock/deduct", "post", "requestBody", "content", "application/json", "schema", "properties")
	require.Equal(t, "#/components/schemas/Qty", mapAt(t, deduct, "qty")["$ref"])
	require.Equal(t, "#/components/schemas/Token", mapAt(t, deduct, "token")["$ref"])
	require.Equal(t, "#/components/schemas/SKUName", mapAt(t, deduct, "sku")["$ref"])

	// Headers: an X-Request-ID is echoed exactly when it matches the
	// documented pattern (otherwise replaced by a fresh id, which matches
	// it too); an Idempotency-Key is accepted exactly when it matches its.
	a := embeddedApp(t)
	h := storefront(t, a)
	requestIDRe := regexp.MustCompile(mapAt(t, doc, "components", "headers", "RequestID", "schema")["pattern"].(string))
	var keyRe *regexp.Regexp
	for _, p := range mapAt(t, doc, "paths", "/v1/orders", "post")["parameters"].([]any) {
		if pm := mapAt(t, deref(t, doc, p)); pm["name"] == "Idempotency-Key" {
			keyRe = regexp.MustCompile(mapAt(t, pm, "schema")["pattern"].(string))
		}
	}
	require.NotNil(t, keyRe, "POST /v1/orders documents Idempotency-Key")
	headerSamples := append(slices.Clone(samples), "a b", "a/b+c=d", "~", "\x7f", "\t", strings.Repeat("k", 128)+"x", "é")
	for i, s := range headerSamples {
		rec := send(t, h, "GET", "/healthz", "", "X-Request-ID", s)
		echoed := rec.Header().Get("X-Request-ID") == s
		require.Equal(t, requestIDRe.MatchString(s), echoed, "X-Request-ID %q", s)
		require.Regexp(t, requestIDRe, rec.Header().Get("X-Request-ID"))

		if s == "" {
			continue // no key at all
		}
		code, body := call(t, h, "POST", "/v1/orders", `{"user_id":"k`+strconv.Itoa(i)+`","items":[{"sku":"DEMO-EBOOK","qty":1}]}`, "Idempotency-Key", s)
		require.Equal(t, keyRe.MatchString(s), code == http.StatusCreated, "Idempotency-Key %q: %d %s", s, code, body)
	}
}

// The error answers the document lists per route, produced through the
// embedded app: status and code.
func TestDocumentedErrorsPerRoute(t *testing.T) {
	a := embeddedApp(t)
	h := storefront(t, a)
	admin := []string{"Authorization", "Bearer " + a.Cfg.AdminToken}
	code, body := call(t, h, "POST", "/v1/orders", `{"user_id":"u1","items":[{"sku":"DEMO-TSHIRT","qty":2}]}`, "Idempotency-Key", "k1")
	require.Equal(t, 201, code, body)
	id := orderOf(t, body)["id"].(string)
	code, body = call(t, h, "POST", "/v1/seckill/DEMO-PHONE/buy", `{"user_id":"u1"}`)
	require.Equal(t, 201, code, body)

	for _, c := range []struct {
		method, path, body string
		header             []string
		status             int
		code               string
	}{
		{"PUT", "/v1/skus/A", `{"stock":1}`, nil, 403, "forbidden"}, // the storefront's client credential
		{"PUT", "/v1/skus/A", `{"stock":1}`, []string{"Authorization", "Bearer nope"}, 401, "unauthorized"},
		{"PUT", "/v1/skus/-A", `{"stock":1}`, admin, 400, "invalid_argument"},
		{"PUT", "/v1/skus/A", `{"stock":-2}`, admin, 400, "invalid_argument"},
		{"PUT", "/v1/skus/A", `{"stock":1,"per_user_limit":10001}`, admin, 400, "invalid_argument"},
		{"PUT", "/v1/skus/A", `{}`, admin, 400, "invalid_argument"},
		{"PUT", "/v1/skus/DEMO-TSHIRT", `{"stock":1}`, admin, 409, "conflict"},
		{"GET", "/v1/skus/-A", "", nil, 400, "invalid_argument"},
		{"GET", "/v1/skus/NOPE", "", nil, 404, "not_found"},
		{"POST", "/v1/skus/DEMO-TSHIRT/adjust", `{"delta":-99,"reason":"x"}`, admin, 409, "conflict"},
		{"POST", "/v1/skus/DEMO-TSHIRT/adjust", `{"delta":1,"reason":"  "}`, admin, 400, "invalid_argument"},
		{"POST", "/v1/skus/DEMO-TSHIRT/adjust", `{"delta":1,"reason":"` + strings.Repeat("r", 201) + `"}`, admin, 400, "invalid_argument"},
		{"POST", "/v1/skus/DEMO-TSHIRT/adjust", `{"delta":1000000000000,"reason":"x"}`, admin, 400, "invalid_argument"},
		{"POST", "/v1/stock/deduct", `{"sku":"NOPE","qty":1,"token":"t1"}`, nil, 404, "not_found"},
		{"POST", "/v1/stock/deduct", `{"sku":"DEMO-TSHIRT","qty":1.5,"token":"t1"}`, nil, 400, "invalid_argument"},
		{"POST", "/v1/stock/deduct", `{"sku":"DEMO-TSHIRT","qty":1,"token":"t1"} {}`, nil, 400, "invalid_argument"},
		{"POST", "/v1/stock/deduct", `{"sku":"DEMO-TSHIRT","qty":1,"token":"` + strings.Repeat("x", 70<<10) + `"}`, nil, 413, "payload_too_large"},
		{"POST", "/v1/stock/commit", `{"sku":"NOPE","token":"t1"}`, nil, 404, "not_found"},
		{"POST", "/v1/orders", `{"user_id":"u1","items":[{"sku":"NOPE","qty":1}]}`, nil, 404, "not_found"},
		{"POST", "/v1/orders", `{"user_id":"u1","items":[{"sku":"DEMO-TSHIRT","qty":3}]}`, []string{"Idempotency-Key", "k1"}, 409, "conflict"},
		{"POST", "/v1/orders", `{"user_id":"u1","items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, []string{"Idempotency-Key", "a b"}, 400, "invalid_argument"},
		{"POST", "/v1/orders", `{"user_id":"u1","items":[{"sku":"DEMO-TSHIRT","qty":6000},{"sku":"DEMO-TSHIRT","qty":6000}]}`, nil, 400, "invalid_argument"},
		{"POST", "/v1/orders", `{"user_id":"u1","items":[{"sku":"DEMO-PHONE","qty":10}]}`, nil, 409, "insufficient_stock"},
		{"POST", "/v1/orders", `{"user_id":"` + strings.Repeat("u", 65) + `","items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, []string{"X-Buyer-Token", buyerToken(t, a, "u1")}, 403, "forbidden"},
		{"GET", "/v1/orders/nope", "", nil, 404, "not_found"},
		{"GET", "/v1/orders/-x", "", nil, 400, "invalid_argument"},
		{"POST", "/v1/orders/nope/cancel", "", []string{"X-Buyer-Token", buyerToken(t, a, "u1")}, 404, "not_found"},
		{"POST", "/v1/orders/" + id + "/refund", "", nil, 403, "forbidden"},
		{"POST", "/v1/orders/" + id + "/refund", "", []string{"Authorization", "Bearer nope"}, 401, "unauthorized"},
		{"POST", "/v1/orders/" + id + "/refund", "", admin, 409, "conflict"},
		{"POST", "/v1/orders/nope/refund", "", admin, 404, "not_found"},
		{"POST", "/v1/payments/callback", `{}`, nil, 401, "unauthorized"},
		{"POST", "/v1/seckill/NOPE/buy", `{"user_id":"u1"}`, nil, 404, "not_found"},
		{"POST", "/v1/seckill/DEMO-PHONE/buy", `{"user_id":"u1"}`, nil, 409, "conflict"},
		{"POST", "/v1/seckill/-X/buy", `{"user_id":"u1"}`, nil, 400, "invalid_argument"},
		{"GET", "/v1/nothing", "", nil, 404, "not_found"},
		{"DELETE", "/v1/skus/DEMO-TSHIRT", "", nil, 405, "method_not_allowed"},
	} {
		code, body := call(t, h, c.method, c.path, c.body, c.header...)
		require.Equal(t, c.status, code, "%s %s %.80s: %s", c.method, c.path, c.body, body)
		require.Contains(t, body, `"code":"`+c.code+`"`, "%s %s", c.method, c.path)
	}

	// Cancel of a cancelled order; payments for an unknown order or with a bad id.
	u1 := []string{"X-Buyer-Token", buyerToken(t, a, "u1")}
	code, body = call(t, h, "POST", "/v1/orders/"+id+"/cancel", "", u1...)
	require.Equal(t, 200, code, body)
	code, body = call(t, h, "POST", "/v1/orders/"+id+"/cancel", "", u1...)
	require.Equal(t, 409, code, body)
	require.Contains(t, body, `"code":"conflict"`)
	code, body = pay(t, a, "nope", "p1")
	require.Equal(t, 404, code, body)
	code, body = pay(t, a, "-x", "p1")
	require.Equal(t, 400, code, body)
	code, body = pay(t, a, id, "-p")
	require.Equal(t, 400, code, body)

	// The health routes.
	expect(t, h, "GET", "/healthz", "", 200, `{"status":"ok"}`)
	code, body = call(t, h, "GET", "/readyz", "")
	require.Equal(t, 200, code, body)
	var ready map[string]string
	require.NoError(t, json.Unmarshal([]byte(body), &ready))
	for name, v := range ready {
		require.Equal(t, "ok", v, name)
	}
}
