package stock

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Raw script results. They never leave this package: Store turns them into
// values and sentinel errors.
const (
	resNotInitialised = -3
	resInsufficient   = -2
	resUnlimited      = -1
	resReplay         = -4  // the token reserved before: the database answers
	resCounted        = -5  // the change is already in Redis's value
	resClamped        = -6  // the change would take Redis below zero: realign
	resOverLimit      = -7  // the buyer would pass the per-user limit
	resNotStarted     = -8  // a campaign's window has not opened
	resEnded          = -9  // a campaign's window has closed
	resBuyersCold     = -10 // a SKU's buyers hash is not its stock's initialisation's: initialise both
	resForgotten      = -11 // the change is too old to tell whether it was applied: realign
)

// buyersEpoch is a buyers hash's field that names the initialisation its
// counts come from (the stock hash's e, or a campaign pool's). No user id
// has braces, so it is no buyer's. A buyers hash without it, or with
// another epoch than its stock hash's or pool's, is not initialised: lost
// (expired, evicted, deleted) or left from elsewhere. The scripts count and
// give back in it only when it is the initialisation their change belongs
// to, and an admission with a limit initialises it first (-10). A SKU's
// buyers hash and a campaign's (cb:ID) are fenced alike.
const buyersEpoch = "{e}"

// deductScript admits a reservation: it checks and takes qty units at once,
// and, for a buyer under a per-user limit, counts them against the limit in
// the same call (one round trip per sale). KEYS[1] is a SKU's stock hash or
// a campaign's pool (the same fields, plus its window o and z): a hash with
// a window admits only while ARGV[6] is inside [o, z).
//
//	KEYS[1] stock or campaign pool
//	KEYS[2] token key (or KEYS[1] again: no token to remember); its value
//	        is when Redis admitted it (Redis's clock, unix ms: staleTokenScript)
//	KEYS[3] buyers hash (only with a per-user limit): the SKU's, or the campaign's
//	ARGV[1] qty (> 0)  ARGV[2] token key TTL, ms (0: no token key)
//	ARGV[3] buyer  ARGV[4] limit  ARGV[5] buyers hash TTL, ms (with a SKU's
//	        KEYS[3]: a campaign's buyers hash expires with its pool, as its
//	        initialisation set)
//	ARGV[6] now, unix ms (the caller's clock; with it the hash's window is read,
//	        which only a campaign's pool has)
//
// Returns {r, epoch}: r is -3 not initialised, -8 the window has not opened
// (now < o), -9 it has closed (now >= z), -10 a SKU's buyers hash is not
// initialised (it does not carry the stock's epoch), -2 not enough, -1
// unlimited (nothing taken; the buyer's units are counted), -4 the token was
// seen before (nothing taken: the database has the answer), -7 the buyer
// would pass the limit, or n >= 0, the units left after taking; epoch is the
// initialisation the units were taken from. -8, -9, -10, -7, -4 and -2 take
// and count nothing. The checks run in that order: initialised, window,
// buyers initialised, limit, token, stock.
//
// Only a caller that passes the time (ARGV[6]: AdmitCampaign always does)
// reads the window; a SKU's callers pass none, and their one HMGET reads a
// and e alone, as before campaigns: reading the two absent fields too cost
// every SKU admission about half a microsecond of Redis's time (a sixth of
// the script's own, measured by running its body in a loop inside Redis). A
// SKU's hash has no window anyway, and the window in Redis is a pre-filter:
// the database's clock decides it.
var deductScript = redis.NewScript(`
local v
if ARGV[6] then
  v = redis.call('HMGET', KEYS[1], 'a', 'e', 'o', 'z')
else
  v = redis.call('HMGET', KEYS[1], 'a', 'e')
end
if not v[1] then return {-3, 0} end
local a, e = tonumber(v[1]), tonumber(v[2])
if v[3] then
  local now = tonumber(ARGV[6]) or 0
  if now < tonumber(v[3]) then return {-8, e} end
  if now >= tonumber(v[4]) then return {-9, e} end
end
local q = tonumber(ARGV[1])
local b = KEYS[3]
if b then
  local m = redis.call('HMGET', b, '` + buyersEpoch + `', ARGV[3])
  if m[1] ~= v[2] then return {-10, e} end
  if tonumber(m[2] or '0') + q > tonumber(ARGV[4]) then return {-7, e} end
end
local left = -1
if a ~= -1 then
  local tk = ARGV[2] ~= '0'
  if tk and redis.call('EXISTS', KEYS[2]) == 1 then return {-4, e} end
  if a < q then return {-2, e} end
  left = redis.call('HINCRBY', KEYS[1], 'a', -q)
  if tk then
    local t = redis.call('TIME')
    redis.call('SET', KEYS[2], t[1] * 1000 + math.floor(t[2] / 1000), 'PX', ARGV[2])
  end
end
if b then
  redis.call('HINCRBY', b, ARGV[3], q)
  if not v[3] then redis.call('PEXPIRE', b, ARGV[5]) end
end
return {left, e}
`)

// undoScript gives back units a deduction took whose reservation the database
// refused or never recorded, and the buyer's count it took with them.
//
//	KEYS[1] stock or campaign pool  KEYS[2] token key (or KEYS[1] again)
//	KEYS[3] its buyers hash (only for an admission that counted a buyer)
//	ARGV[1] qty  ARGV[2] epoch the deduction returned  ARGV[3] buyer (with KEYS[3])
//
// The units and the count go back only into the initialisation they were
// taken from: after a re-init the value came from the database, which never
// had them. The token key is dropped so the token may reserve again. Returns
// the new value, or -5 when no units were given back.
var undoScript = redis.NewScript(`
if KEYS[2] ~= KEYS[1] then redis.call('DEL', KEYS[2]) end
if KEYS[3] then
  local m = redis.call('HMGET', KEYS[3], '` + buyersEpoch + `', ARGV[3])
  if m[1] == ARGV[2] and m[2] then
    if redis.call('HINCRBY', KEYS[3], ARGV[3], -tonumber(ARGV[1])) <= 0 then redis.call('HDEL', KEYS[3], ARGV[3]) end
  end
end
local v = redis.call('HMGET', KEYS[1], 'a', 'e')
if not v[1] or tonumber(v[1]) < 0 or v[2] ~= ARGV[2] then return -5 end
return redis.call('HINCRBY', KEYS[1], 'a', ARGV[1])
`)

// appliedKept is how many of the changes it applied a stock hash (or a
// campaign's pool) remembers, so that one delivered again is not counted
// twice (see applyScript). More arriving out of order than this are
// realigned instead: the database knows them all.
const appliedKept = 32

// applyScript brings a change the database committed into Redis, exactly
// once: the change of available units, and the buyers' counts it moved; of
// a SKU, or of a campaign's pool (the pool's row has its own seq and epoch,
// fencing its Redis copy the same way; a campaign's change moves no counts).
//
//	KEYS[1] stock or campaign pool
//	KEYS[2] a SKU's buyers hash (only when the change moved counts)
//	ARGV[1] delta  ARGV[2] the database seq of the change
//	ARGV[3] epoch of the deduction this change stands for, or 0 (none)
//	ARGV[4] the change's ref, "" for a change alone at its seq
//	        (inventory.Change.Ref)
//	ARGV[5], ARGV[6], ... user, count delta (with KEYS[2])
//
// The change is already in Redis when the initialisation read the database
// at or after seq (the init holds the SKU's row lock while it writes, so it
// read either all of a change or none of it), when it is a deduction taken
// from this very initialisation, or when it was applied before: a second
// delivery of one change (go-redis sending the script again after a lost
// reply, a caller applying it again) finds its id, "#seq" or "#seq:ref",
// among the hash's fields. The hash keeps the ids of the last appliedKept
// changes applied into its initialisation (each valued its seq, n their
// count) and m, the highest seq of those it forgot, the lowest seq first.
// So a change whose id is not kept and whose seq is above m was never
// applied (applied, it would be kept, or forgotten with a seq at most m)
// and is applied now, whatever the order changes arrive in: concurrent
// follow-ups land out of seq order, and seqs have gaps (most changes are
// admissions Redis took itself). One at or below m cannot be told apart
// from a forgotten one: -11, and the caller realigns. The initialisation
// replaces the whole hash, the ids and m with it: a change above its seq
// commits after its write, so none was applied into it yet.
//
// Otherwise delta is added, and each count delta where the buyers hash is
// this initialisation's (a lost one is initialised again, from the
// database, by the next admission that needs it). Returns the new value;
// -3 not initialised (the next init reads the database), -1 unlimited, -5
// already counted, -6 the value would go below zero (it is set to zero, and
// the caller realigns), -11 too old to tell whether it was counted
// (nothing changed; the caller realigns).
var applyScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'a', 'e', 's', 'm')
if not v[1] then return -3 end
if ARGV[3] ~= '0' and v[2] == ARGV[3] then return -5 end
local seq = tonumber(ARGV[2])
if tonumber(v[3]) >= seq then return -5 end
local id = '#' .. ARGV[2]
if ARGV[4] ~= '' then id = id .. ':' .. ARGV[4] end
if redis.call('HEXISTS', KEYS[1], id) == 1 then return -5 end
local forgot = tonumber(v[4] or '0')
if seq <= forgot then return -11 end
redis.call('HSET', KEYS[1], id, ARGV[2])
if redis.call('HINCRBY', KEYS[1], 'n', 1) > ` + strconv.Itoa(appliedKept) + ` then
  local h = redis.call('HGETALL', KEYS[1])
  local low, lowSeq
  for i = 1, #h, 2 do
    if string.byte(h[i], 1) == 35 then
      local s = tonumber(h[i + 1])
      if not lowSeq or s < lowSeq then low, lowSeq = i, s end
    end
  end
  redis.call('HDEL', KEYS[1], h[low])
  redis.call('HINCRBY', KEYS[1], 'n', -1)
  if lowSeq > forgot then redis.call('HSET', KEYS[1], 'm', h[low + 1]) end
end
local b = KEYS[2]
if b and redis.call('HGET', b, '` + buyersEpoch + `') == v[2] then
  for i = 5, #ARGV, 2 do
    if redis.call('HINCRBY', b, ARGV[i], ARGV[i + 1]) <= 0 then redis.call('HDEL', b, ARGV[i]) end
  end
end
local a = tonumber(v[1])
if a == -1 then return -1 end
local n = a + tonumber(ARGV[1])
if n < 0 then
  redis.call('HSET', KEYS[1], 'a', 0)
  return -6
end
redis.call('HSET', KEYS[1], 'a', n)
return n
`)

// initScript writes a SKU's level and its buyers' counts read from the
// database, as one initialisation (a campaign's pool has its own,
// campaignInitScript, beside writeCampaign).
//
//	KEYS[1] stock  KEYS[2] buyers hash  KEYS[3] the counts staged for it
//	ARGV[1] available (-1 unlimited)  ARGV[2] epoch  ARGV[3] database seq
//	ARGV[4] "cold" (only if the stock is absent: the double check, atomic
//	        with the write), "buyers" (only if the buyers hash is not the
//	        stock's initialisation's) or "force" (realign: replace whatever
//	        Redis has)
//	ARGV[5] buyers hash TTL, ms  ARGV[6] "1" when counts were staged in
//	        KEYS[3]
//
// The counts are staged beforehand in a key of this initialisation's own
// (Store.write, in chunks, so a SKU with many buyers does not hold Redis in
// one long script); this script makes them the buyers hash, marked with
// the epoch, atomically with the level. It replaces the whole stock hash
// (or pool): what applyScript remembered of the replaced initialisation
// goes with it. Returns {1, value} when it wrote,
// {0, current} when it found Redis already initialised (the staged counts
// are dropped).
var initScript = redis.NewScript(`
if ARGV[4] ~= 'force' then
  local cur = redis.call('HMGET', KEYS[1], 'a', 'e')
  if cur[1] and (ARGV[4] == 'cold' or redis.call('HGET', KEYS[2], '` + buyersEpoch + `') == cur[2]) then
    if ARGV[6] == '1' then redis.call('UNLINK', KEYS[3]) end
    return {0, tonumber(cur[1])}
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'a', ARGV[1], 'e', ARGV[2], 's', ARGV[3])
redis.call('UNLINK', KEYS[2])
if ARGV[6] == '1' then redis.call('RENAME', KEYS[3], KEYS[2]) end
redis.call('HSET', KEYS[2], '` + buyersEpoch + `', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {1, tonumber(ARGV[1])}
`)

// initialisedScript is the double check outside the init script: whether
// a SKU's stock (or a campaign's pool) is initialised and, with ARGV[1]
// "buyers", its buyers hash too.
//
//	KEYS[1] stock or pool  KEYS[2] its buyers hash  ARGV[1] "cold" or "buyers"
var initialisedScript = redis.NewScript(`
local e = redis.call('HGET', KEYS[1], 'e')
if not e then return 0 end
if ARGV[1] == 'buyers' and redis.call('HGET', KEYS[2], '` + buyersEpoch + `') ~= e then return 0 end
return 1
`)

// DeductScriptSHA is the deduction script's SHA1, for driving it directly
// (redis-benchmark EVALSHA measures the ceiling of the same script).
func DeductScriptSHA() string { return deductScript.Hash() }

// ApplyScriptSHA is the SHA1 of the script Store.Apply runs, for tests
// that hold or fail it by name instead of by its arguments' shape.
func ApplyScriptSHA() string { return applyScript.Hash() }

// LoadDeductScript loads the deduction script on rdb (every master of a cluster).
func LoadDeductScript(ctx context.Context, rdb redis.Scripter) error {
	return deductScript.Load(ctx, rdb).Err()
}

// DeductKeys are the KEYS of the deduction script for sku, as an order line
// uses it (no token key); its ARGV are qty and "0".
func DeductKeys(sku string) []string { return admitKeys(sku, "") }

// staleTokenScript forgets a token key whose admission is older than
// ARGV[1] ms by Redis's own clock (a token key written before admissions
// carried their time holds the units, and counts as old).
//
//	KEYS[1] token key  ARGV[1] age, ms
//
// Returns 1 when it forgot the key, 0 when there is none or it is younger.
var staleTokenScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local at = tonumber(v) or 0
if now - at <= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)
