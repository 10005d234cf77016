"""The Redis layouts' share of the size bound: Lua helpers their scripts include, so that a full store gives up
the soonest-expiring entry of the tenant holding the most entries (`cache.shares` says why).

Beside each layout's sorted set of all entries by expiry (the bound), under a base key `B`:
- `B:t:<tenant tag>`: the tenant's entries by expiry (members as in the layout's sorted set);
- `B:tc`: tenant tag -> how many entries that sorted set holds, so the largest holder is one `ZREVRANGE`.

A member is an entry id ("<tenant tag>-<hash>", stream layout) or "<namespace>:<entry id>" (vector-set layout);
the tag is read from it. Every script that adds or removes a member of the bound calls `tenant_add` or
`tenant_remove` in the same script, so the three structures change together. The keys are built inside the
scripts: on a Cluster the base carries the shard's hash tag, so they stay in the script's slot.

Tested in `tests/integration/test_cache_redis.py`.
"""

from __future__ import annotations

__all__ = ["FAIR_LUA", "counts_key", "tenant_key"]


def tenant_key(base: str, tag: str) -> str:
    return f"{base}:t:{tag}"


def counts_key(base: str) -> str:
    return f"{base}:tc"


FAIR_LUA = """
local function tag_of(member)
  local id = string.match(member, '([^:]*)$')
  return string.match(id, '^([^-]+)-')
end
local function tenant_count(base, tag, key)
  local n = redis.call('ZCARD', key)
  if n == 0 then redis.call('ZREM', base .. ':tc', tag) else redis.call('ZADD', base .. ':tc', n, tag) end
end
local function tenant_add(base, member, expiry)
  local tag = tag_of(member)
  if tag == nil then return end
  local key = base .. ':t:' .. tag
  redis.call('ZADD', key, expiry, member)
  tenant_count(base, tag, key)
end
local function tenant_remove(base, member)
  local tag = tag_of(member)
  if tag == nil then return end
  local key = base .. ':t:' .. tag
  redis.call('ZREM', key, member)
  tenant_count(base, tag, key)
end
-- Take the bound's expired members (up to `limit`) out of it and out of their tenants' sets; returns them.
local function take_expired(base, zset, now, limit)
  local expired = redis.call('ZRANGE', zset, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  for _, m in ipairs(expired) do
    redis.call('ZREM', zset, m)
    tenant_remove(base, m)
  end
  return expired
end
-- Take `excess` members out of the bound `zset` (and their tenants' sets), each the soonest-expiring of the
-- tenant holding the most; the caller drops their data. Members the bound no longer holds are skipped; entries
-- stored before the tenant sets existed are taken soonest-expiring first once no tenant set is left.
local function fair_pop(base, zset, excess)
  local out = {}
  local tries = excess * 2 + 16
  while excess > 0 and tries > 0 do
    tries = tries - 1
    local top = redis.call('ZREVRANGE', base .. ':tc', 0, 0)
    if #top == 0 then break end
    local key = base .. ':t:' .. top[1]
    local popped = redis.call('ZPOPMIN', key, 1)
    tenant_count(base, top[1], key)
    if #popped > 0 and redis.call('ZREM', zset, popped[1]) == 1 then
      out[#out + 1] = popped[1]
      excess = excess - 1
    end
  end
  if excess > 0 then
    local popped = redis.call('ZPOPMIN', zset, excess)
    for i = 1, #popped, 2 do
      tenant_remove(base, popped[i])
      out[#out + 1] = popped[i]
    end
  end
  return out
end
"""
