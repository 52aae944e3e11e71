package inventory

// The id rules: one per kind of id, each checked once where a request
// enters (every layer that checks an id calls the rule here, so the HTTP
// layer, the order layer and the stock layer cannot drift apart), each no
// longer than the column the id is stored in. docs/design.md "Id rules"
// lists them. They are loops, not regular expressions: every buy checks a
// buyer's id.

// ValidateUserID accepts a buyer's user id: 1-64 characters of A-Z a-z
// 0-9 . _ : -, starting with a letter or digit. 64 is orders.user_id,
// stock_reservations.buyer and buyer_quotas.user_id (VARCHAR(64)); a
// buyer token's subject and a limited buyer in Redis follow the same rule.
func ValidateUserID(id string) error { return validateName("user_id", id, 64, true) }

// ValidateOrderID accepts an order id: 1-40 characters of A-Z a-z 0-9 .
// _ : -, starting with a letter or digit. 40 is orders.id (VARCHAR(40));
// the service's own ids are UUIDv7 (36). what names it in the error
// ("order id", or "cursor" for a listing's).
func ValidateOrderID(what, id string) error { return validateName(what, id, 40, true) }

// ValidatePaymentID accepts a payment id: 1-64 characters of A-Z a-z 0-9
// . _ : -, starting with a letter or digit (orders.payment_id is
// VARCHAR(128); 64 is the rule the payment callback has always had).
func ValidatePaymentID(id string) error { return validateName("payment_id", id, 64, true) }

// ValidateCampaignID accepts a campaign id: 1-60 characters of a SKU's
// alphabet (A-Z a-z 0-9 . _ -, no colon or brace, so its Redis keys are
// neither a token's nor another campaign's and keep the hash tag),
// starting with a letter or digit. 60, not campaigns.id's 64: "c:" + id
// names its quota in buyer_quotas.sku (VARCHAR(64)) and its pool's token.
func ValidateCampaignID(id string) error {
	if validName(id, 60, false) {
		return nil
	}
	return Invalidf("campaign id must be 1-60 characters of A-Z a-z 0-9 . _ -, got %q", Truncate(id))
}

func validateName(what, v string, max int, colon bool) error {
	if validName(v, max, colon) {
		return nil
	}
	return Invalidf("%s must be 1-%d characters of A-Z a-z 0-9 . _ : -", what, max)
}

// validName: 1-max characters of A-Z a-z 0-9 . _ - (and : with colon),
// the first a letter or digit.
func validName(v string, max int, colon bool) bool {
	ok := len(v) >= 1 && len(v) <= max
	for i := 0; ok && i < len(v); i++ {
		b := v[i]
		ok = 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
			i > 0 && (b == '.' || b == '_' || b == '-' || colon && b == ':')
	}
	return ok
}
