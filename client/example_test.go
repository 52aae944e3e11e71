package client_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/acme/inventory/client"
)

// A checkout backend places alice's order with its client credential and
// her buyer token, from the exports `make run` prints. The Idempotency-Key
// (one per checkout) makes a retry after a lost answer return the order the
// first call created instead of reserving the units again. README.md quotes
// this function's body.
func Example() {
	api, err := client.NewClientWithResponses(os.Getenv("INVENTORY_URL"),
		client.WithRequestEditorFn(client.BearerAuth(os.Getenv("CLIENT_TOKEN"))))
	if err != nil {
		log.Fatal(err)
	}
	resp, err := api.CreateOrderWithResponse(context.Background(),
		&client.CreateOrderParams{IdempotencyKey: new("checkout-7f3a")},
		client.CreateOrderJSONRequestBody{Items: []client.Item{{Sku: "DEMO-TSHIRT", Qty: 2}}},
		client.BuyerToken(os.Getenv("ALICE_TOKEN")))
	if err != nil {
		log.Fatal(err) // no answer: retry with the same key
	}
	switch {
	case resp.JSON201 != nil: // PENDING until paid, cancelled or expired
		fmt.Println(resp.JSON201.Id, resp.JSON201.Status, resp.JSON201.ExpiresAt)
	case resp.JSON409 != nil: // insufficient_stock, or the buyer's per-user limit
		fmt.Println("refused:", resp.JSON409.Error.Code, resp.JSON409.Error.Message)
	default:
		log.Fatalf("inventory answered %s: %s", resp.Status(), resp.Body)
	}
}
