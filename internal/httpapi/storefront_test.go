package httpapi_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/acme/inventory/internal/app"
	"github.com/acme/inventory/internal/identity"
)

// storefront plays the checkout backend in front of the service, for tests
// whose subject is not authentication: it sends its client credential when
// a request carries no Authorization, and, for a body naming a user_id
// without an X-Buyer-Token, the token the storefront signs for that logged-in
// buyer. The credentials themselves are tested on a.Handler() directly
// (auth_test.go). Every exchange is checked against openapi.yaml as the
// service sees it (validating), the storefront's headers included.
func storefront(t testing.TB, a *app.App) http.Handler {
	h := validating(t, a.Handler())
	return storefrontHandler(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			r.Header.Set("Authorization", "Bearer "+a.Cfg.ClientTokens[0])
		}
		if r.Header.Get(identity.Header) == "" && r.Body != nil {
			body, _ := io.ReadAll(r.Body) // httptest bodies read whole
			r.Body = io.NopCloser(bytes.NewReader(body))
			var b struct {
				UserID string `json:"user_id"`
			}
			if json.Unmarshal(body, &b) == nil && b.UserID != "" {
				r.Header.Set(identity.Header, buyerToken(t, a, b.UserID))
			}
		}
		h.ServeHTTP(w, r)
	})
}

// storefrontHandler is the storefront; its exchanges are already checked
// against the document, so call and send do not check them again.
type storefrontHandler func(http.ResponseWriter, *http.Request)

func (f storefrontHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { f(w, r) }

func (storefrontHandler) checksOpenAPI() {}

// buyerToken is what the storefront signs for its logged-in buyer user.
func buyerToken(_ testing.TB, a *app.App, user string) string {
	tok, err := identity.Issue(a.Cfg.BuyerKey, user, time.Hour)
	if err != nil {
		panic(err) // an HMAC signature over a valid claim set cannot fail
	}
	return tok
}
