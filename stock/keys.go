package stock

import "strconv"

// Every key of one SKU carries the SKU as a Redis Cluster hash tag, so all of
// them live in one slot and each per-SKU script is cluster-safe.
//
//	inv:{SKU}:stock       hash    a = available units (-1 unlimited), e = epoch of
//	                              the initialisation, s = the database seq it read;
//	                              the changes applied since (applyScript): #SEQ or
//	                              #SEQ:REF = SEQ for each of the last 32, n their
//	                              count, m the highest seq forgotten;
//	                              absent = not initialised
//	inv:{SKU}:t:TOKEN     string  qty of a token-API reservation, expires with the hold
//	                              (only so a replay is sent to the database)
//	inv:{SKU}:initlock    string  the cold-init lock (token-owned)
//	inv:{SKU}:buyers      hash    user -> units counted against the per-user limit,
//	                              and {e} = the epoch of the initialisation the counts
//	                              come from (written with the stock hash; see buyersEpoch)
//	inv:{SKU}:buyers:EPOCH hash   the counts an initialisation stages before it writes
//	                              (renamed to inv:{SKU}:buyers by it; expires in a minute)
//	inv:{SKU}:c:ID        hash    campaign ID's pool (a flash sale's allotment of the
//	                              SKU): a, e, s as the stock hash (a >= 0, the units
//	                              the campaign has left; e, s and the changes applied
//	                              fence it against the pool's reservation row) and its
//	                              window, o = opens (starts_at) and z = closes
//	                              (ends_at), unix ms;
//	                              absent = not initialised
//	inv:{SKU}:cb:ID       hash    user -> units bought in campaign ID (its per-user limit),
//	                              and {e} = the epoch of the pool's initialisation the
//	                              counts come from (written with the pool, as a SKU's)
//	inv:{SKU}:cb:ID:EPOCH hash    the counts an initialisation of the pool stages before
//	                              it writes (renamed to inv:{SKU}:cb:ID; expires in a minute)
//	inv:{SKU}:ci:ID       string  campaign ID's cold-init lock (token-owned)
//
// A campaign's keys carry its SKU's hash tag (one slot with the SKU). Its ID
// has a SKU's alphabet (no colon, no brace), so no campaign key is another's
// or a token's. An ended campaign has none: its end deletes the pool and
// the buyers hash, and both expire CampaignKeysLinger after the window's
// close whatever happens. Redis keeps no per-reservation state for orders:
// the database does.
//
// The keys that belong to no SKU are named here too, so one file lists every
// key the service writes:
//
//	inv:{timeouts:N}:due       zset    order id -> deadline (unix ms), shard N
//	inv:{timeouts:N}:claimed   zset    order id -> lease end (unix ms), shard N
//	inv:{timeouts}:due         zset    the unsharded queue of earlier versions
//	inv:{timeouts}:claimed     zset    (drained, never written)
//	inv:{...}:lock, sweeplock  string  the one-node jobs' locks (internal/lock/keys.go)
//	inv:stockback              channel "stock came back" (clears sold-out flags)

func skuTag(sku string) string { return "inv:{" + sku + "}:" }

func stockKey(sku string) string        { return skuTag(sku) + "stock" }
func tokenKey(sku, token string) string { return skuTag(sku) + "t:" + token }
func initLockKey(sku string) string     { return skuTag(sku) + "initlock" }
func buyersKey(sku string) string       { return skuTag(sku) + "buyers" }

// stagedBuyersKey holds the counts one initialisation (epoch) writes before
// its script makes them the buyers hash.
func stagedBuyersKey(sku string, epoch int64) string {
	return skuTag(sku) + "buyers:" + strconv.FormatInt(epoch, 10)
}

func campaignKey(c Campaign) string         { return skuTag(c.SKU) + "c:" + c.ID }
func campaignBuyersKey(c Campaign) string   { return skuTag(c.SKU) + "cb:" + c.ID }
func campaignInitLockKey(c Campaign) string { return skuTag(c.SKU) + "ci:" + c.ID }

// stagedCampaignBuyersKey holds the counts one initialisation (epoch) of
// c's pool writes before its script makes them the buyers hash.
func stagedCampaignBuyersKey(c Campaign, epoch int64) string {
	return campaignBuyersKey(c) + ":" + strconv.FormatInt(epoch, 10)
}

// admitKeys are the deduction script's KEYS: without a token, the stock key
// twice (the script then keeps no token key).
func admitKeys(sku, token string) []string {
	if token == "" {
		return []string{stockKey(sku), stockKey(sku)}
	}
	return []string{stockKey(sku), tokenKey(sku, token)}
}

// The delay queue's keys (see DelayQueue).
func timeoutDueKey(n int) string     { return "inv:{timeouts:" + strconv.Itoa(n) + "}:due" }
func timeoutClaimedKey(n int) string { return "inv:{timeouts:" + strconv.Itoa(n) + "}:claimed" }

const (
	// legacyTimeoutDueKey and legacyTimeoutClaimedKey are the unsharded
	// queue of earlier versions. Nothing is scheduled there any more, but
	// pollers still drain it, so that orders an older node put there (before
	// the upgrade, or during a rolling one) are released at their deadline
	// rather than left to the sweep.
	legacyTimeoutDueKey     = "inv:{timeouts}:due"
	legacyTimeoutClaimedKey = "inv:{timeouts}:claimed"
	// stockBackChannel carries the SKUs whose stock came back, so every node
	// clears its local sold-out flag.
	stockBackChannel = "inv:stockback"
)
