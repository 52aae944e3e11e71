package stock

// Every key of one SKU carries the SKU as a Redis Cluster hash tag, so all of
// them live in one slot and each per-SKU script is cluster-safe.
//
//	inv:{SKU}:stock       hash    a = available units (-1 unlimited), e = epoch of
//	                              the initialisation, s = the database seq it read;
//	                              absent = not initialised
//	inv:{SKU}:t:TOKEN     string  qty of a token-API reservation, expires with the hold
//	                              (only so a replay is sent to the database)
//	inv:{SKU}:initlock    string  the cold-init lock (token-owned)
//	inv:{SKU}:buyers      hash    user -> units bought, for per-user limits
//
// Redis keeps no per-reservation state for orders: the database does.

func skuTag(sku string) string { return "inv:{" + sku + "}:" }

func stockKey(sku string) string        { return skuTag(sku) + "stock" }
func tokenKey(sku, token string) string { return skuTag(sku) + "t:" + token }
func initLockKey(sku string) string     { return skuTag(sku) + "initlock" }
func buyersKey(sku string) string       { return skuTag(sku) + "buyers" }

// admitKeys are the deduction script's KEYS: without a token, the stock key
// twice (the script then keeps no token key).
func admitKeys(sku, token string) []string {
	if token == "" {
		return []string{stockKey(sku), stockKey(sku)}
	}
	return []string{stockKey(sku), tokenKey(sku, token)}
}
