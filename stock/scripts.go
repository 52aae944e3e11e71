package stock

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Raw script results. They never leave this package: Store turns them into
// values and sentinel errors.
const (
	resNotInitialised = -3
	resInsufficient   = -2
	resUnlimited      = -1
	resReleased       = -4 // the token was released: it can take nothing any more
	resNotHeld        = -5 // the token holds nothing (never reserved, or lost)
)

// deductScript takes qty units for token, once.
//
//	KEYS[1] stock  KEYS[2] holds  KEYS[3] held  KEYS[4] deadlines  KEYS[5] tomb
//	ARGV[1] token  ARGV[2] qty (> 0)  ARGV[3] hold deadline, unix ms
//
// Returns -3 stock key absent (not initialised), -2 not enough (nothing
// taken), -1 unlimited (nothing taken), -4 token already released, or n >= 0:
// the units left after taking. A replay of a token that holds (or sold) its
// units returns the first call's n and takes nothing.
var deductScript = redis.NewScript(`
local stock = redis.call('GET', KEYS[1])
if not stock then return -3 end
stock = tonumber(stock)
if stock == -1 then return -1 end
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held then return tonumber(string.match(held, ':(%-?%d+)$')) end
local tomb = redis.call('GET', KEYS[5])
if tomb then
  if string.sub(tomb, 1, 1) == 'S' then return tonumber(string.match(tomb, ':(%-?%d+)$')) end
  return -4
end
local qty = tonumber(ARGV[2])
if stock < qty then return -2 end
local left = redis.call('DECRBY', KEYS[1], qty)
redis.call('HSET', KEYS[2], ARGV[1], qty .. ':' .. left)
redis.call('INCRBY', KEYS[3], qty)
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
return left
`)

// releaseScript gives back what token holds, once.
//
//	KEYS[1] stock  KEYS[2] holds  KEYS[3] held  KEYS[4] deadlines  KEYS[5] tomb
//	ARGV[1] token  ARGV[2] tombstone TTL, ms  ARGV[3] "release" or "undo"
//
// "release" (cancel, timeout, refund) ends the token: it gives back an unpaid
// hold or a sale (refund) and leaves a tombstone so a late deduct with the same
// token takes nothing. A token that holds nothing is tombstoned too, for the
// same reason. "undo" (rolling back a partly reserved cart) gives back an
// unpaid hold and leaves no tombstone, so the cart may be retried.
// Returns the units given back (0 when there was nothing to give back). When
// the stock key is absent (Redis lost it) nothing is added to it: the next
// cold init counts from the database.
var releaseScript = redis.NewScript(`
local function giveback(q)
  local s = redis.call('GET', KEYS[1])
  if s and tonumber(s) >= 0 then redis.call('INCRBY', KEYS[1], q) end
end
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held then
  local q = tonumber(string.match(held, '^(%d+):'))
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('DECRBY', KEYS[3], q)
  redis.call('ZREM', KEYS[4], ARGV[1])
  giveback(q)
  if ARGV[3] == 'release' then redis.call('SET', KEYS[5], 'R:' .. q, 'PX', ARGV[2]) end
  return q
end
if ARGV[3] == 'undo' then return 0 end
local tomb = redis.call('GET', KEYS[5])
if tomb and string.sub(tomb, 1, 1) == 'S' then
  local q = tonumber(string.match(tomb, '^S:(%d+)'))
  giveback(q)
  redis.call('SET', KEYS[5], 'R:' .. q, 'PX', ARGV[2])
  return q
end
if not tomb then redis.call('SET', KEYS[5], 'R:0', 'PX', ARGV[2]) end
return 0
`)

// confirmScript turns token's unpaid hold into a sale (on payment).
//
//	KEYS[1] stock  KEYS[2] holds  KEYS[3] held  KEYS[4] deadlines  KEYS[5] tomb
//	ARGV[1] token  ARGV[2] tombstone TTL, ms
//
// Returns the units sold (a replay returns them again), 0 for an unlimited
// SKU, -4 if the token was released first, -5 if it holds nothing.
var confirmScript = redis.NewScript(`
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held then
  local q, r = string.match(held, '^(%d+):(%-?%d+)$')
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('DECRBY', KEYS[3], tonumber(q))
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('SET', KEYS[5], 'S:' .. q .. ':' .. r, 'PX', ARGV[2])
  return tonumber(q)
end
local tomb = redis.call('GET', KEYS[5])
if tomb then
  if string.sub(tomb, 1, 1) == 'S' then return tonumber(string.match(tomb, '^S:(%d+)')) end
  return -4
end
if redis.call('GET', KEYS[1]) == '-1' then return 0 end
return -5
`)

// initScript initialises a cold SKU; it does nothing if the stock key exists
// (the double check, atomic with the write).
//
//	KEYS[1] stock  KEYS[2] holds  KEYS[3] held  KEYS[4] deadlines
//	KEYS[4+i] tomb of the i-th reservation listed in ARGV
//	ARGV[1] database stock (-1 = unlimited)
//	ARGV[2] paid-but-unapplied units (deductions minus restores not yet applied)
//	ARGV[3+3(i-1)..] token, qty, deadline (unix ms) of each unpaid reservation
//	in the database
//
// The holds are the union of those already in Redis (live reservations whose
// order row may not be written yet) and the database's, less tokens with a
// tombstone (already released or sold). The value written is
// database stock - paid-but-unapplied - held, never below 0, so a cold key
// never creates stock.
// Returns {1, value, clamped} when it initialised, {0, current} when the key
// was already there.
var initScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then return {0, tonumber(cur)} end
local db = tonumber(ARGV[1])
if db == -1 then
  redis.call('SET', KEYS[1], -1)
  return {1, -1, 0}
end
local add = {}
local n = (#ARGV - 2) / 3
for i = 1, n do
  local token = ARGV[3 + 3 * (i - 1)]
  if redis.call('HEXISTS', KEYS[2], token) == 0 and redis.call('EXISTS', KEYS[4 + i]) == 0 then
    add[#add + 1] = i
  end
end
local held = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do
  held = held + tonumber(string.match(v, '^(%d+):'))
end
for _, i in ipairs(add) do held = held + tonumber(ARGV[4 + 3 * (i - 1)]) end
local value = db - tonumber(ARGV[2]) - held
local clamped = 0
if value < 0 then value, clamped = 0, 1 end
for _, i in ipairs(add) do
  local b = 3 + 3 * (i - 1)
  redis.call('HSET', KEYS[2], ARGV[b], ARGV[b + 1] .. ':' .. value)
  redis.call('ZADD', KEYS[4], ARGV[b + 2], ARGV[b])
end
redis.call('SET', KEYS[3], held)
redis.call('SET', KEYS[1], value)
return {1, value, clamped}
`)

// adjustScript adds delta to an initialised, limited SKU's available units.
//
//	KEYS[1] stock
//	ARGV[1] delta (may be negative)
//
// Returns the new value; -3 if not initialised (the database change is picked
// up by the next cold init), -1 if unlimited, -2 if a negative delta exceeds
// what is available (held units cannot be taken away).
var adjustScript = redis.NewScript(`
local s = redis.call('GET', KEYS[1])
if not s then return -3 end
s = tonumber(s)
if s == -1 then return -1 end
local d = tonumber(ARGV[1])
if s + d < 0 then return -2 end
return redis.call('INCRBY', KEYS[1], d)
`)

// quotaScript takes qty of a user's per-SKU purchase limit.
//
//	KEYS[1] buyers (hash user -> units bought)
//	ARGV[1] user  ARGV[2] qty (negative gives back)  ARGV[3] limit
//
// Returns 1 when the user stays within limit (the units are counted), 0 when
// the purchase would exceed it (nothing counted).
var quotaScript = redis.NewScript(`
local q = tonumber(ARGV[2])
if q < 0 then
  local left = redis.call('HINCRBY', KEYS[1], ARGV[1], q)
  if left <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
  return 1
end
local had = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if had + q > tonumber(ARGV[3]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], q)
return 1
`)

// DeductScriptSHA is the deduction script's SHA1, for driving it directly
// (redis-benchmark EVALSHA measures the ceiling of the same script).
func DeductScriptSHA() string { return deductScript.Hash() }

// LoadDeductScript loads the deduction script on rdb (every master of a cluster).
func LoadDeductScript(ctx context.Context, rdb redis.Scripter) error {
	return deductScript.Load(ctx, rdb).Err()
}

// DeductKeys are the KEYS of the deduction script for sku and token.
func DeductKeys(sku, token string) []string { return tokenKeys(sku, token) }
