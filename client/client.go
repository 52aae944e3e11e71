// Package client is the typed Go client of the inventory service, for the
// checkout and storefront backends that call it. It is generated from the
// service's OpenAPI document (internal/httpapi/openapi.yaml, served at
// /openapi.yaml) into client.gen.go: ClientWithResponses has a method per
// operation (CreateOrderWithResponse, GetSKUWithResponse, ...) that takes
// typed parameters and body and answers the status, the raw body and the
// body decoded into the type the document gives that status (JSON201,
// JSON409, ...).
//
// Credentials are request editors: BearerAuth for the client credential
// (once, with WithRequestEditorFn, for every call) and BuyerToken for the
// buyer a call acts for.
//
// A receiver of the service's webhooks checks each delivery with
// VerifyWebhook (webhook.go: its signature, its timestamp, and the stock
// event it carries).
package client

//go:generate go tool oapi-codegen -config oapi-codegen.yaml ../internal/httpapi/openapi.yaml

import (
	"context"
	"net/http"
)

// BearerAuth sends token as the caller's credential (Authorization: Bearer):
// a client credential on the client routes, the admin token on the admin
// ones.
func BearerAuth(token string) RequestEditorFn {
	return func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+token)
		return nil
	}
}

// BuyerToken sends the buyer's token (X-Buyer-Token), the JWT the storefront
// signed for its logged-in buyer: placing an order, a seckill purchase and a
// cancel act for the buyer it names.
func BuyerToken(token string) RequestEditorFn {
	return func(_ context.Context, req *http.Request) error {
		req.Header.Set("X-Buyer-Token", token)
		return nil
	}
}
