"""The Lua scripts every read and ack goes through, and the entries the read scripts return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ACK_CHUNK = 5000
_KEPT_FIELDS = 16
_KEPT_FIELD_BYTES = 256

# Every read goes through these scripts, so that no reply holds more than the byte budget
# (max_batch_bytes) plus one event: XREADGROUP, XRANGE and XAUTOCLAIM have no byte limit. Inside
# Redis, new entries are measured before they are handed out, pending and claimed ones are read
# one at a time, and each event is cut to max_event_bytes. Each entry comes back as {id, kind
# (0 event, 1 no such field, 2 deleted), event, its whole length, other fields, joined};
# "joined": the group's PEL holds nothing between it and the entry before, so the two can share
# an ID range in a token.
_ENTRY_LUA = """
local function entry(key, group, id, fields, field, max, check, prev)
  local e = {id, 2, '', 0, {}, 0}
  if fields then
    local payload = nil
    for i = 1, #fields, 2 do
      if fields[i] == field then payload = fields[i + 1] end
    end
    if payload then
      e[2] = 0
      e[4] = #payload
      e[3] = string.sub(payload, 1, max)
    else
      e[2] = 1
      local kept = {}
      for i = 1, math.min(#fields, KEPT_ITEMS), 1 do
        kept[i] = string.sub(fields[i], 1, KEPT_BYTES)
      end
      e[5] = kept
    end
  end
  if prev then
    if check == '0' or #redis.call('XPENDING', key, group, '(' .. prev, '(' .. id, 1) == 0 then
      e[6] = 1
    end
  end
  return e
end
local function size(e)
  local n = #e[3] + 64
  for _, v in ipairs(e[5]) do n = n + #v end
  return n
end
""".replace("KEPT_ITEMS", str(2 * _KEPT_FIELDS)).replace("KEPT_BYTES", str(_KEPT_FIELD_BYTES))

READ_LUA = (
    _ENTRY_LUA
    + """
-- ARGV: group, consumer, start ('>' or an ID), count, budget, field, max_event_bytes, after
-- (with '>': the last entry this consumer read as new, or '')
local key, group, consumer, at = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local count, budget, max = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[7])
local out, used, prev = {}, 0, nil
if at == '>' then
  -- New entries: measured first (XRANGE from where the group stands, a few at a time), then
  -- as many as fit the budget handed out by one XREADGROUP.
  local from = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    if info['name'] == group then from = info['last-delivered-id'] end
  end
  if not from then
    return redis.error_reply('NOGROUP No such consumer group ' .. group .. ' for key ' .. key)
  end
  -- The group handed out nothing since this consumer's last read: the first entry may join
  -- that read's last one (if nothing is pending between them either).
  if ARGV[8] ~= '' and from == ARGV[8] then prev = ARGV[8] end
  local n, step = 0, 16
  while n < count and used < budget do
    local r = redis.call('XRANGE', key, '(' .. from, '+', 'COUNT', math.min(step, count - n))
    if #r == 0 then break end
    for _, raw in ipairs(r) do
      n = n + 1
      from = raw[1]
      for _, v in ipairs(raw[2]) do used = used + #v end
      if used >= budget or n >= count then break end
    end
    step = math.max(1, math.min(128, math.floor((budget - used) * n / math.max(used, 1))))
  end
  if n == 0 then return out end
  local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS', key, '>')
  for i, raw in ipairs(r[1][2]) do
    out[i] = entry(key, group, raw[1], raw[2], ARGV[6], max, i == 1 and '1' or '0', prev)
    prev = raw[1]
  end
  return out
end
-- This consumer's pending entries after an ID, one at a time (read only after a restart or a
-- lost connection).
while #out < count and used < budget do
  local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 1, 'STREAMS', key, at)
  if #r[1][2] == 0 then break end
  local raw = r[1][2][1]
  local e = entry(key, group, raw[1], raw[2], ARGV[6], max, '1', prev)
  out[#out + 1] = e
  at, prev = raw[1], raw[1]
  used = used + size(e)
end
return out
"""
)

FETCH_LUA = (
    _ENTRY_LUA
    + """
-- ARGV: group, budget, field, max_event_bytes, IDs...
local key, group = KEYS[1], ARGV[1]
local budget, max = tonumber(ARGV[2]), tonumber(ARGV[4])
local out, used, prev = {}, 0, nil
for i = 5, #ARGV do
  if used >= budget then break end
  local r = redis.call('XRANGE', key, ARGV[i], ARGV[i])
  local fields = false
  if #r > 0 then fields = r[1][2] end
  local e = entry(key, group, ARGV[i], fields, ARGV[3], max, '1', prev)
  prev = ARGV[i]
  out[#out + 1] = e
  used = used + size(e)
end
return out
"""
)

# Through a script only because redis-py drops the cursor of a JUSTID reply.
CLAIM_LUA = """
return redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5],
                  'JUSTID')
"""

ACK_LUA = """
-- ARGV: group, limit, then first and last ID of each range. XACKs every entry pending in the
-- group within the ranges, at most about `limit` of them; returns {ranges done, where the next
-- one resumes, count acked}.
local key, group, limit = KEYS[1], ARGV[1], tonumber(ARGV[2])
local done, acked, i = 0, 0, 3
local start = nil
while i < #ARGV do
  local first, last = start or ARGV[i], ARGV[i + 1]
  local p = redis.call('XPENDING', key, group, first, last, limit)
  if #p > 0 then
    local ids = {}
    for j = 1, #p do ids[j] = p[j][1] end
    redis.call('XACK', key, group, unpack(ids))
    acked = acked + #ids
  end
  if #p < limit then
    done, start, i = done + 1, nil, i + 2
  else
    start = '(' .. p[#p][1]
  end
  if acked >= limit then break end
end
return {done, start or '', acked}
"""


@dataclass(slots=True)
class Entry:
    """A stream entry as the read scripts return it."""

    id: str
    kind: int
    """0: the event is in ``payload``; 1: the entry has no such field; 2: deleted."""
    payload: bytes
    """The event, cut to ``max_event_bytes``."""
    length: int
    """The event's whole length."""
    kept: list[bytes]
    """With kind 1: the entry's first fields (names and values, cut) for the dead letter."""
    joined: bool
    """Nothing is pending in the group between this entry and the one before it."""

    @classmethod
    def parse(cls, raw: Any) -> Entry:
        entry_id, kind, payload, length, kept, joined = raw
        return cls(text(entry_id), int(kind), bytes(payload), int(length), list(kept), bool(joined))


def text(b: bytes | str) -> str:
    """A reply's bytes as text (IDs, field names)."""
    return b if isinstance(b, str) else b.decode("utf-8", "backslashreplace")
