-- Appends one entry to a stream unless its dedup id was appended within the
-- window; atomic, as every script is.
-- KEYS[1]: the stream; KEYS[2]: its dedup set (dedup id -> time of append, ms).
-- ARGV[1]: the dedup id; ARGV[2]: the window in ms; ARGV[3]: MAXLEN ~ (0: no
-- trimming); ARGV[4..]: field, value, field, value, ...
-- Returns the new entry's id, or 0 when the id was seen (nothing appended).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - window))
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
local args = {KEYS[1]}
if ARGV[3] ~= '0' then
  args[#args + 1] = 'MAXLEN'
  args[#args + 1] = '~'
  args[#args + 1] = ARGV[3]
end
args[#args + 1] = '*'
for i = 4, #ARGV do
  args[#args + 1] = ARGV[i]
end
local id = redis.call('XADD', unpack(args))
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('PEXPIRE', KEYS[2], window)
return id
