package stock

// Every key of one SKU carries the SKU as a Redis Cluster hash tag, so all of
// them live in one slot and each per-SKU script is cluster-safe.
//
//	inv:{SKU}:stock       string  available units; -1 = unlimited; absent = not initialised
//	inv:{SKU}:holds       hash    token -> "qty:result" for every unpaid reservation
//	inv:{SKU}:held        string  sum of the qty in holds
//	inv:{SKU}:deadlines   zset    token -> deadline (unix ms) of each hold
//	inv:{SKU}:tomb:TOKEN  string  "S:qty:result" (sold) or "R:qty" (released), expires
//	inv:{SKU}:initlock    string  the cold-init lock (token-owned)
//	inv:{SKU}:buyers      hash    user -> units bought, for per-user limits

func skuTag(sku string) string { return "inv:{" + sku + "}:" }

func stockKey(sku string) string     { return skuTag(sku) + "stock" }
func holdsKey(sku string) string     { return skuTag(sku) + "holds" }
func heldKey(sku string) string      { return skuTag(sku) + "held" }
func deadlinesKey(sku string) string { return skuTag(sku) + "deadlines" }

// DeadlinesKey names the zset of sku's hold deadlines (token -> unix ms), for
// the timeout release.
func DeadlinesKey(sku string) string { return deadlinesKey(sku) }
func tombKey(sku, token string) string {
	return skuTag(sku) + "tomb:" + token
}
func initLockKey(sku string) string { return skuTag(sku) + "initlock" }
func buyersKey(sku string) string   { return skuTag(sku) + "buyers" }

// tokenKeys are the keys a per-token script touches, in the order the scripts
// declare them.
func tokenKeys(sku, token string) []string {
	return []string{stockKey(sku), holdsKey(sku), heldKey(sku), deadlinesKey(sku), tombKey(sku, token)}
}
