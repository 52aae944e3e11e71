package httpapi_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/stretchr/testify/require"

	"github.com/acme/inventory/internal/httpapi"
)

// The document is checked by a real OpenAPI validator (kin-openapi), and
// every exchange the package's tests make through storefront, call and send
// is checked against it: the answer always (status documented for the
// operation, body matching its schema, required headers present and well
// formed), the request when the service accepted it (a 2xx for a request the
// document calls invalid is a mismatch too).

// loadOpenAPI parses openapi.yaml (the file the server embeds and serves).
func loadOpenAPI() (*openapi3.T, error) {
	raw, err := os.ReadFile("openapi.yaml")
	if err != nil {
		return nil, err
	}
	return openapi3.NewLoader().LoadFromData(raw)
}

// strictValidation is how the document must validate: examples and schema
// defaults against their schemas, patterns compiled, formats known.
var strictValidation = []openapi3.ValidationOption{
	openapi3.EnableExamplesValidation(),
	openapi3.EnableSchemaDefaultsValidation(),
	openapi3.EnableSchemaPatternValidation(),
	openapi3.EnableSchemaFormatValidation(),
	openapi3.EnableMultiError(),
}

// The document is valid OpenAPI 3.0, examples included.
func TestOpenAPIDocumentIsValid(t *testing.T) {
	doc, err := loadOpenAPI()
	require.NoError(t, err)
	require.NoError(t, doc.Validate(context.Background(), strictValidation...))
	_, err = gorillamux.NewRouter(doc)
	require.NoError(t, err, "the document's paths make a router")
}

// statusCodes are the error codes each error status may carry (info.description).
var statusCodes = map[int][]string{
	400: {"invalid_argument"}, 401: {"unauthorized"}, 403: {"forbidden"}, 404: {"not_found"},
	405: {"method_not_allowed"}, 409: {"conflict", "insufficient_stock", "sale_not_started", "sale_ended"}, 412: {"precondition_failed"}, 413: {"payload_too_large"},
	429: {"rate_limited"}, 500: {"internal"}, 503: {"unavailable"},
}

// openAPIChecker validates exchanges against the document.
type openAPIChecker struct {
	router routers.Router
	// generic answers any route may give (info.description): 404 and 405
	// for a request that matches no operation, 413 and 500 anywhere.
	generic map[int]*openapi3.ResponseRef
	// options is the answer to OPTIONS on a path that exists.
	options *openapi3.ResponseRef
	doc     *openapi3.T
}

var loadChecker = sync.OnceValues(func() (*openAPIChecker, error) {
	doc, err := loadOpenAPI()
	if err != nil {
		return nil, err
	}
	if err := doc.Validate(context.Background(), strictValidation...); err != nil {
		return nil, fmt.Errorf("openapi.yaml is not valid: %w", err)
	}
	// Operations are found by path alone: the document's server is an
	// example address, test requests go to example.com.
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, err
	}
	c := &openAPIChecker{router: router, doc: doc, generic: map[int]*openapi3.ResponseRef{}}
	for status, name := range map[int]string{404: "RouteNotFound", 405: "MethodNotAllowed", 413: "PayloadTooLarge", 500: "Internal"} {
		r := doc.Components.Responses[name]
		if r == nil {
			return nil, fmt.Errorf("components.responses.%s is missing", name)
		}
		c.generic[status] = r
	}
	if c.options = doc.Components.Responses["Options"]; c.options == nil {
		return nil, errors.New("components.responses.Options is missing")
	}
	return c, nil
})

// exchange is one request as the service saw it and the answer it gave.
type exchange struct {
	req  *http.Request // its body readable again
	resp *http.Response
	data []byte // the answer's body
}

// check returns the mismatches between an exchange and the document.
func (c *openAPIChecker) check(x exchange) error {
	ctx := context.Background()
	opts := &openapi3filter.Options{
		IncludeResponseStatus:   true,
		MultiError:              true,
		SkipSettingDefaults:     true,
		AuthenticationFunc:      credentialShape,
		SchemaValidationOptions: []openapi3.SchemaValidationOption{openapi3.EnableFormatValidation()},
	}
	status := x.resp.StatusCode
	var errs []error

	route, params, err := c.router.FindRoute(x.req)
	documented := err == nil // an operation the request can be checked against
	// The router hands over path parameters as sent; their schemas hold for
	// the values they encode (%2D is "-"), as the service reads them.
	for name, v := range params {
		if d, err := url.PathUnescape(v); err == nil {
			params[name] = d
		}
	}
	if err != nil {
		// No documented operation: only the generic not-found and
		// method-not-allowed answers (or the generic 413/500) fit, and
		// OPTIONS on a path that exists.
		want := map[error]int{routers.ErrPathNotFound: 404, routers.ErrMethodNotAllowed: 405}
		w, known := want[err]
		if !known {
			return fmt.Errorf("finding the operation: %w", err)
		}
		generic := c.generic
		if w == 405 && x.req.Method == http.MethodOptions {
			w, generic = 204, map[int]*openapi3.ResponseRef{204: c.options}
		}
		if status != w && status != 413 && status != 500 {
			return fmt.Errorf("no documented operation (%v), yet the answer is %d, not %d", err, status, w)
		}
		route = &routers.Route{Spec: c.doc, Path: x.req.URL.Path, Method: x.req.Method, PathItem: &openapi3.PathItem{},
			Operation: &openapi3.Operation{Responses: openapi3.NewResponses(openapi3.WithStatus(status, cmp.Or(generic[status], c.generic[status])))}}
		params = nil
	} else if op := route.Operation; op.Responses.Status(status) == nil && c.generic[status] != nil && status != 404 && status != 405 {
		// A generic answer the operation does not list itself.
		generic := *op
		generic.Responses = openapi3.NewResponses(openapi3.WithStatus(status, c.generic[status]))
		r := *route
		r.Operation = &generic
		route = &r
	}

	if r := route.Operation.Responses.Status(status); r != nil && isErrorAnswer(r.Value) {
		errs = append(errs, errorCodeMatches(status, x.data))
	}
	reqIn := &openapi3filter.RequestValidationInput{Request: x.req, PathParams: params, Route: route, Options: opts}
	if documented && status >= 200 && status < 300 {
		if err := openapi3filter.ValidateRequest(ctx, reqIn); err != nil {
			errs = append(errs, fmt.Errorf("the service answered %d to a request the document calls invalid: %w", status, err))
		}
	}
	respIn := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: reqIn, Status: status, Header: x.resp.Header,
		Body: io.NopCloser(bytes.NewReader(x.data)), Options: opts,
	}
	if err := openapi3filter.ValidateResponse(ctx, respIn); err != nil {
		errs = append(errs, fmt.Errorf("answer %d: %w", status, err))
	}
	return errors.Join(errs...)
}

// isErrorAnswer: the response's body is the Error schema.
func isErrorAnswer(r *openapi3.Response) bool {
	mt := r.Content.Get("application/json")
	return mt != nil && mt.Schema != nil && mt.Schema.Ref == "#/components/schemas/Error"
}

// errorCodeMatches: an error answer's code is one its status carries.
func errorCodeMatches(status int, data []byte) error {
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal(data, &body); err != nil {
		return fmt.Errorf("answer %d is not a JSON error: %w", status, err)
	}
	codes, ok := statusCodes[status]
	if !ok {
		return fmt.Errorf("answer %d is not a status the document names", status)
	}
	if !slices.Contains(codes, body.Error.Code) {
		return fmt.Errorf("answer %d carries code %q; the document gives it %v", status, body.Error.Code, codes)
	}
	return nil
}

// credentialShape accepts any credential of the right shape: the service
// checks credentials, the validator that a request it accepted presented
// what the operation's security requirement names.
func credentialShape(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	s, h := in.SecurityScheme, in.RequestValidationInput.Request.Header
	switch {
	case s.Type == "http" && strings.EqualFold(s.Scheme, "bearer"):
		scheme, tok, _ := strings.Cut(h.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || tok == "" {
			return fmt.Errorf("%s: no Authorization: Bearer credential", in.SecuritySchemeName)
		}
	case s.Type == "apiKey" && s.In == "header":
		if h.Get(s.Name) == "" {
			return fmt.Errorf("%s: no %s header", in.SecuritySchemeName, s.Name)
		}
	default:
		return fmt.Errorf("%s: unexpected security scheme %s", in.SecuritySchemeName, s.Type)
	}
	return nil
}

// checkedHandler serves through h and checks every exchange against the
// document, failing t on a mismatch.
type checkedHandler struct {
	t       testing.TB
	h       http.Handler
	checker *openAPIChecker
}

// openAPIChecked marks a handler whose exchanges are already checked.
type openAPIChecked interface{ checksOpenAPI() }

func (checkedHandler) checksOpenAPI() {}

// validating wraps h so its exchanges are checked against the document
// (h itself when it already is).
func validating(t testing.TB, h http.Handler) http.Handler {
	if _, ok := h.(openAPIChecked); ok {
		return h
	}
	c, err := loadChecker()
	if err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	return checkedHandler{t: t, h: h, checker: c}
}

func (v checkedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	// The request as the service receives it, for the validator afterwards.
	seen := r.Clone(context.Background())
	rec := httptest.NewRecorder()
	v.h.ServeHTTP(rec, r)
	resp := rec.Result()
	data := rec.Body.Bytes()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(data)

	if len(body) > 0 && seen.Header.Get("Content-Type") == "" {
		// The service reads a body as JSON whatever its Content-Type says
		// (info.description); the document names application/json.
		seen.Header.Set("Content-Type", "application/json")
	}
	seen.Body = io.NopCloser(bytes.NewReader(body))
	seen.ContentLength = int64(len(body))
	seen.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if err := v.checker.check(exchange{req: seen, resp: resp, data: data}); err != nil {
		msg := fmt.Sprintf("openapi.yaml does not describe %s %s (body %.200q) -> %d %.300s:\n%v",
			r.Method, r.URL.RequestURI(), body, resp.StatusCode, data, err)
		if _, fuzz := v.t.(*testing.F); fuzz {
			// Inside a fuzz target only the target's *testing.T may fail;
			// a panic fails that input (and makes it a crasher).
			panic(msg)
		}
		v.t.Errorf("%s", msg)
	}
}

// credentials are what a caller presents for each security scheme.
type credentials struct {
	admin, client, buyer, paymentSecret string
}

// present sets the headers of the schemes named on req (whose body is body).
func (c credentials) present(req *http.Request, body string, schemes ...string) {
	for _, s := range schemes {
		switch s {
		case "admin":
			req.Header.Set("Authorization", "Bearer "+c.admin)
		case "client":
			req.Header.Set("Authorization", "Bearer "+c.client)
		case "buyer":
			req.Header.Set("X-Buyer-Token", c.buyer)
		case "paymentSignature":
			ts := strconv.FormatInt(time.Now().Unix(), 10)
			req.Header.Set("X-Timestamp", ts)
			req.Header.Set("X-Signature", hex.EncodeToString(httpapi.Sign(c.paymentSecret, ts, []byte(body))))
		}
	}
}

// satisfies reports whether presenting schemes meets one of the
// requirements; the admin token is accepted where a client credential is.
func satisfies(reqs openapi3.SecurityRequirements, schemes []string) bool {
	if len(reqs) == 0 {
		return true
	}
	has := func(s string) bool {
		return slices.Contains(schemes, s) || (s == "client" && slices.Contains(schemes, "admin"))
	}
	for _, r := range reqs {
		ok := true
		for s := range r {
			ok = ok && has(s)
		}
		if ok {
			return true
		}
	}
	return false
}

// Every operation refuses (401) a caller that does not present what its
// security requirement names, and lets through (not 401) one that does:
// no credentials, each scheme alone, the requirements themselves, and each
// requirement with one of its schemes missing. Admin operations refuse a
// client credential with 403. Bodies are the document's examples.
func TestOpenAPISecurityMatchesRoutes(t *testing.T) {
	doc, err := loadOpenAPI()
	require.NoError(t, err)
	a := embeddedApp(t)
	h := validating(t, a.Handler())
	creds := credentials{admin: a.Cfg.AdminToken, client: a.Cfg.ClientTokens[0], buyer: buyerToken(t, a, "alice"), paymentSecret: a.Cfg.PaymentSecret}
	for _, s := range []string{"admin", "client", "buyer", "paymentSignature"} {
		require.Contains(t, doc.Components.SecuritySchemes, s)
	}

	for _, path := range doc.Paths.InMatchingOrder() {
		url := strings.NewReplacer("{sku}", "DEMO-TSHIRT", "{id}", "o1").Replace(path)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodOptions, url, nil))
		require.Equal(t, http.StatusNoContent, rec.Code, "OPTIONS %s needs no credentials", path)
		for method, op := range doc.Paths.Value(path).Operations() {
			where := method + " " + path
			reqs := doc.Security
			if op.Security != nil {
				reqs = *op.Security
			}
			body := ""
			if op.RequestBody != nil {
				mt := op.RequestBody.Value.Content.Get("application/json")
				require.NotNil(t, mt, "%s: a JSON request body", where)
				require.NotNil(t, mt.Example, "%s: the request body has an example", where)
				raw, err := json.Marshal(mt.Example)
				require.NoError(t, err)
				body = string(raw)
			}
			// The credential sets tried: none, each scheme alone (so an
			// admin operation is sent a client credential), each
			// requirement, and each requirement less one of its schemes.
			sets := [][]string{{}, {"admin"}, {"client"}, {"buyer"}, {"paymentSignature"}, {"admin", "buyer"}}
			for _, r := range reqs {
				var all []string
				for s := range r {
					all = append(all, s)
				}
				slices.Sort(all)
				sets = append(sets, all)
				for i := range all {
					sets = append(sets, slices.Delete(slices.Clone(all), i, i+1))
				}
			}
			for _, schemes := range sets {
				req := httptest.NewRequest(method, url, strings.NewReader(body))
				creds.present(req, body, schemes...)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				adminOnly := len(reqs) > 0 && !slices.ContainsFunc(reqs, func(r openapi3.SecurityRequirement) bool { _, ok := r["admin"]; return !ok })
				switch {
				case satisfies(reqs, schemes):
					require.NotEqual(t, http.StatusUnauthorized, rec.Code, "%s with %v: %s", where, schemes, rec.Body)
				case adminOnly && slices.Contains(schemes, "client") && !slices.Contains(schemes, "admin"):
					// A client credential is known, and not allowed here.
					require.Equal(t, http.StatusForbidden, rec.Code, "%s with %v: %s", where, schemes, rec.Body)
				default:
					require.Equal(t, http.StatusUnauthorized, rec.Code, "%s with %v: %s", where, schemes, rec.Body)
					require.NotEmpty(t, rec.Header().Get("WWW-Authenticate"), "%s with %v", where, schemes)
				}
			}
		}
	}
}

// The checker itself: it finds an undocumented status, a body off its
// schema, a missing required header, a wrong code for a status, and a 2xx
// for a request the document calls invalid.
func TestOpenAPICheckerFindsMismatches(t *testing.T) {
	c, err := loadChecker()
	require.NoError(t, err)
	orderJSON := `{"id":"o1","user_id":"alice","status":"PENDING","expires_at":"2025-01-02T15:19:05Z",` +
		`"created_at":"2025-01-02T15:04:05Z","updated_at":"2025-01-02T15:04:05Z","items":[{"sku":"DEMO-TSHIRT","qty":1}]}`
	type answered struct {
		resp *http.Response
		data []byte
	}
	answer := func(status int, body string, header ...string) answered {
		rec := httptest.NewRecorder()
		rec.Header().Set("Content-Type", "application/json")
		rec.Header().Set("X-Request-ID", "req-1")
		for i := 0; i+1 < len(header); i += 2 {
			if header[i+1] == "" {
				rec.Header().Del(header[i])
			} else {
				rec.Header().Set(header[i], header[i+1])
			}
		}
		rec.WriteHeader(status)
		rec.WriteString(body)
		return answered{rec.Result(), rec.Body.Bytes()}
	}
	request := func(method, path, body string, header ...string) *http.Request {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer x")
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		return r
	}
	ex := func(req *http.Request, a answered) exchange {
		return exchange{req: req, resp: a.resp, data: a.data}
	}
	getOrder := request("GET", "/v1/orders/o1", "")
	newOrder := func() *http.Request {
		return request("POST", "/v1/orders", `{"items":[{"sku":"DEMO-TSHIRT","qty":1}]}`, "X-Buyer-Token", "t")
	}
	for name, c2 := range map[string]struct {
		x    exchange
		want string // "" = no mismatch
	}{
		"fine":                {ex(getOrder, answer(200, orderJSON)), ""},
		"created":             {ex(newOrder(), answer(201, orderJSON, "Location", "/v1/orders/o1")), ""},
		"undocumented status": {ex(getOrder, answer(409, `{"error":{"code":"conflict","message":"x"}}`)), "status is not supported"},
		"body off schema":     {ex(getOrder, answer(200, `{"id":"o1"}`)), "doesn't match schema"},
		"undocumented field":  {ex(getOrder, answer(200, strings.Replace(orderJSON, `"id"`, `"extra":1,"id"`, 1))), "doesn't match schema"},
		"no X-Request-ID":     {ex(getOrder, answer(200, orderJSON, "X-Request-ID", "")), `"X-Request-ID" missing`},
		"no Location":         {ex(newOrder(), answer(201, orderJSON)), `"Location" missing`},
		"no challenge":        {ex(getOrder, answer(401, `{"error":{"code":"unauthorized","message":"x"}}`)), `"WWW-Authenticate" missing`},
		"wrong code":          {ex(getOrder, answer(404, `{"error":{"code":"conflict","message":"x"}}`)), `carries code "conflict"`},
		"invalid request accepted": {ex(request("POST", "/v1/orders", `{"items":[]}`, "X-Buyer-Token", "t"), answer(201, orderJSON, "Location", "/v1/orders/o1")),
			"calls invalid"},
		"no buyer token accepted": {ex(request("POST", "/v1/orders", `{"items":[{"sku":"A","qty":1}]}`), answer(201, orderJSON, "Location", "/v1/orders/o1")),
			"calls invalid"},
		"invalid request refused": {ex(request("POST", "/v1/orders", `{"items":[]}`), answer(400, `{"error":{"code":"invalid_argument","message":"x"}}`)), ""},
		"no such route":           {ex(request("GET", "/v1/nothing", ""), answer(404, `{"error":{"code":"not_found","message":"no such route"}}`)), ""},
		"no such route, 200":      {ex(request("GET", "/v1/nothing", ""), answer(200, `{}`)), "no documented operation"},
		"method not allowed":      {ex(request("DELETE", "/v1/orders/o1", ""), answer(405, `{"error":{"code":"method_not_allowed","message":"x"}}`, "Allow", "GET")), ""},
		"405 without Allow":       {ex(request("DELETE", "/v1/orders/o1", ""), answer(405, `{"error":{"code":"method_not_allowed","message":"x"}}`)), `"Allow" missing`},
		"options":                 {ex(request("OPTIONS", "/v1/orders/o1", ""), answer(204, "", "Allow", "OPTIONS, GET")), ""},
		"options without Allow":   {ex(request("OPTIONS", "/v1/orders/o1", ""), answer(204, "")), `"Allow" missing`},
		"bad date-time":           {ex(getOrder, answer(200, strings.Replace(orderJSON, `"2025-01-02T15:04:05Z"`, `"yesterday"`, 1))), "doesn't match schema"},
		"429 without Retry-After": {ex(request("POST", "/v1/seckill/A/buy", `{}`), answer(429, `{"error":{"code":"rate_limited","message":"x"}}`)), `"Retry-After" missing`},
	} {
		err := c.check(c2.x)
		if c2.want == "" {
			require.NoError(t, err, name)
		} else {
			require.ErrorContains(t, err, c2.want, name)
		}
	}
}
