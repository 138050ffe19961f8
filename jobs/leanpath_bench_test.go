package jobs

// BenchmarkLeanPath*: an experiment, not product code — what a 1-stage run
// costs Redis on a stripped-down hot path, to tell which redesign would
// close the gap to asynq (README "Performance", what would close the gap).
// Each op is one run: submit (new key), claim, finish that reads the next
// entry, as single FCALLs, measured with the meter of the Script
// benchmarks (TASKLEASE_BENCH_CALLGRIND=1 for instructions). The scripts
// keep what a run must write (record, history, index, fencing token, a
// view when watched) and drop the rest (pause, lanes, coalescing, retries,
// follow-ups, rolling-deploy checks). Variants:
//   - packed: request lists per lane and a per-partition sorted set of
//     taken entries (instead of streams and a consumer group), the lease in
//     the record (leaseUntil, and a sorted set of running keys for the
//     reclaimer), the record's state in one US-joined field;
//   - unpacked: the same with today's record fields;
//   - leasekey: unpacked with a lease key (GET, SET PX, DEL) as today;
//   - BenchmarkLeanPathStreamsRun: packed with today's request streams
//     (XADD, XREADGROUP, XACK and XDEL).
//
//	TASKLEASE_BENCH_CALLGRIND=1 go test ./jobs -run '^$' -bench LeanPath -benchtime 2000x

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/benchutil"
)

const leanLib = `#!lua name=leanproto
local US = '\31'
local function clock()
  local t = redis.call('TIME')
  local us6 = string.rep('0', 6 - #t[2]) .. t[2]
  return t[1] .. string.sub(us6, 1, 3), t[1] .. us6
end
-- h: 1 status 2 runId 3 stage 4 stages 5 done 6 attempt 7 maxAttempts 8 sources 9 owner 10 token
-- 11 requestedAt 12 startedAt 13 updatedAt 14 finishedAt 15 nextAttemptAt 16 lastError 17 cancel
-- 18 followUp 19 waiting 20 leaseUntil
local function unpackh(h)
  local t, i, s = {}, 1, 1
  while true do
    local j = string.find(h, US, s, true)
    if not j then t[i] = string.sub(h, s); return t end
    t[i] = string.sub(h, s, j - 1); i = i + 1; s = j + 1
  end
end
local function packh(t) return table.concat(t, US, 1, 20) end
local function hist(key, n_cap, ...)
  local n = redis.call('RPUSH', key, ...)
  if n > n_cap then redis.call('LTRIM', key, -n_cap, -1) end
end
local function ev(now, e, run, src, stage, outcome, owner, token)
  return now .. US .. e .. US .. run .. US .. src .. US .. stage .. US .. outcome .. US .. owner .. US .. token .. US
end
local function next_token(prev, now_us)
  local p = tonumber(prev)
  if p and p + 1 > tonumber(now_us) then return string.format('%.0f', p + 1) end
  return now_us
end
local function first_stage(stages) return string.match(stages, '^[^,]*') end

-- grant_packed: the packed variants' claim of a queued run — the lease in
-- the record (leaseUntil) and in the running set (member), the history,
-- the view when watched. Returns the claim's reply.
local function grant_packed(rec, running, hist_key, watch, run_id, member, source, owner, ttl, now, now_us)
  local t = unpackh(redis.call('HGET', rec, 'h'))
  if t[2] ~= run_id or t[1] ~= 'queued' then return {'ack'} end
  if t[20] ~= '' and tonumber(t[20]) > tonumber(now) then return {'busy'} end
  local token = next_token(t[10], now_us)
  local until_ms = now + tonumber(ttl)
  t[1], t[3], t[6], t[9], t[10], t[12], t[13], t[20] = 'running', first_stage(t[4]), t[6] + 1, owner, token,
    now, now, until_ms
  redis.call('HSET', rec, 'h', packh(t))
  redis.call('ZADD', running, until_ms, member)
  hist(hist_key, 50, ev(now, 'started', t[2], source, t[3], '', owner, token))
  if redis.call('EXISTS', watch) == 1 then redis.call('PUBLISH', 'x', packh(t)) end
  return {'granted', token, t[5], '', t[6], t[4], t[8], t[12], 'queued'}
end

-- done_and_next: the lists variants' finish after the record write — the
-- running set, history, index, expiry, the view when watched — then the
-- next entry for the slot: LPOP (people first) and ZADD to the taken set.
-- KEYS rec hist index running lanep laneb taken watch
-- ARGV owner token runId key stage n retention
local function done_and_next(KEYS, ARGV, now, stage, view)
  redis.call('ZREM', KEYS[4], ARGV[4])
  hist(KEYS[2], 50, ev(now, 'stage', ARGV[3], '', stage, 'done', ARGV[1], ARGV[2]),
    ev(now, 'done', ARGV[3], '', stage, '', ARGV[1], ARGV[2]))
  redis.call('ZADD', KEYS[3], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  redis.call('PEXPIRE', KEYS[2], ARGV[7])
  if redis.call('EXISTS', KEYS[8]) == 1 then redis.call('PUBLISH', 'x', view) end
  local out = {1, 'done'}
  local n = tonumber(ARGV[6])
  if n > 0 then
    local got = redis.call('LLEN', KEYS[5]) > 0 and redis.call('LPOP', KEYS[5], n) or redis.call('LPOP', KEYS[6], n)
    if got then
      local due = now + 30000
      for i = 1, #got do
        redis.call('ZADD', KEYS[7], due, got[i])
        out[#out + 1] = got[i]
      end
    end
  end
  return out
end

-- KEYS rec hist index lane watch   ARGV key runId source stages maxAttempts
redis.register_function('lean_submit', function(KEYS, ARGV)
  local now = clock()
  local rec, src = KEYS[1], ARGV[3]
  local f = redis.call('HMGET', rec, 'h', 'c:' .. src .. ':joined', 'n:' .. src .. ':joined')
  if f[1] then return {'exists'} end
  local h = {'queued', ARGV[2], '', ARGV[4], '0', '0', ARGV[5], src, '', '', now, '', now, '', '', '', '0', '0', '', ''}
  redis.call('HSET', rec, 'h', packh(h), 'key', ARGV[1])
  redis.call('RPUSH', KEYS[4], ARGV[2] .. US .. ARGV[1] .. US .. src)
  hist(KEYS[2], 50, ev(now, 'requested', ARGV[2], src, '', 'started', '', ''))
  redis.call('ZADD', KEYS[3], now, ARGV[1])
  if redis.call('EXISTS', KEYS[5]) == 1 then redis.call('PUBLISH', 'x', packh(h)) end
  return {'started', now}
end)

-- KEYS taken running rec hist watch   ARGV entry owner ttl
redis.register_function('lean_claim', function(KEYS, ARGV)
  local now, now_us = clock()
  local entry = ARGV[1]
  redis.call('ZREM', KEYS[1], entry)
  local e = unpackh(entry) -- runId key source
  return grant_packed(KEYS[3], KEYS[2], KEYS[4], KEYS[5], e[1], e[2], e[3], ARGV[2], ARGV[3], now, now_us)
end)

-- KEYS rec hist index running lanep laneb taken watch
-- ARGV owner token runId key stage n retention
redis.register_function('lean_finish', function(KEYS, ARGV)
  local now = clock()
  local t = unpackh(redis.call('HGET', KEYS[1], 'h'))
  if t[2] ~= ARGV[3] or t[10] ~= ARGV[2] or t[9] ~= ARGV[1] or tonumber(t[20]) < tonumber(now) then return {0} end
  local stage = t[3]
  t[1], t[3], t[5], t[13], t[14], t[20] = 'done', '', t[5] + 1, now, now, ''
  redis.call('HSET', KEYS[1], 'h', packh(t), 'lastSuccessAt', now)
  return done_and_next(KEYS, ARGV, now, stage, packh(t))
end)

-- variant S: the lean path with today's request streams (XADD, XREADGROUP, XACK+XDEL)
redis.register_function('leanS_submit', function(KEYS, ARGV)
  local now = clock()
  local rec, src = KEYS[1], ARGV[3]
  local f = redis.call('HMGET', rec, 'h', 'c:' .. src .. ':joined', 'n:' .. src .. ':joined')
  if f[1] then return {'exists'} end
  local id = redis.call('XADD', KEYS[4], '*', 'key', ARGV[1], 'runId', ARGV[2], 'source', src)
  local h = {'queued', ARGV[2], '', ARGV[4], '0', '0', ARGV[5], src, '', '', now, '', now, '', '', '', '0', '0', '', ''}
  redis.call('HSET', rec, 'h', packh(h), 'key', ARGV[1], 'entry', id)
  hist(KEYS[2], 50, ev(now, 'requested', ARGV[2], src, '', 'started', '', ''))
  redis.call('ZADD', KEYS[3], now, ARGV[1])
  if redis.call('EXISTS', KEYS[5]) == 1 then redis.call('PUBLISH', 'x', packh(h)) end
  return {'started', now}
end)
-- KEYS running rec hist watch   ARGV runId source owner ttl
redis.register_function('leanS_claim', function(KEYS, ARGV)
  local now, now_us = clock()
  return grant_packed(KEYS[2], KEYS[1], KEYS[3], KEYS[4], ARGV[1], KEYS[2], ARGV[2], ARGV[3], ARGV[4], now, now_us)
end)
-- KEYS rec hist index running streamp streamb watch   ARGV owner token runId key entry n retention group
redis.register_function('leanS_finish', function(KEYS, ARGV)
  local now = clock()
  local t = unpackh(redis.call('HGET', KEYS[1], 'h'))
  if t[2] ~= ARGV[3] or t[10] ~= ARGV[2] or t[9] ~= ARGV[1] or tonumber(t[20]) < tonumber(now) then return {0} end
  local stage = t[3]
  t[1], t[3], t[5], t[13], t[14], t[20] = 'done', '', t[5] + 1, now, now, ''
  redis.call('XACK', KEYS[6], ARGV[8], ARGV[5])
  redis.call('XDEL', KEYS[6], ARGV[5])
  redis.call('HSET', KEYS[1], 'h', packh(t), 'lastSuccessAt', now, 'entry', '')
  redis.call('ZREM', KEYS[4], KEYS[1])
  hist(KEYS[2], 50, ev(now, 'stage', ARGV[3], '', stage, 'done', ARGV[1], ARGV[2]),
    ev(now, 'done', ARGV[3], '', stage, '', ARGV[1], ARGV[2]))
  redis.call('ZADD', KEYS[3], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  redis.call('PEXPIRE', KEYS[2], ARGV[7])
  if redis.call('EXISTS', KEYS[7]) == 1 then redis.call('PUBLISH', 'x', packh(t)) end
  local out = {1, 'done'}
  local n = tonumber(ARGV[6])
  if n > 0 then
    local res = false
    if redis.call('XLEN', KEYS[5]) > 0 then
      res = redis.call('XREADGROUP', 'GROUP', ARGV[8], ARGV[1], 'COUNT', n, 'STREAMS', KEYS[5], '>')
    end
    if not res and redis.call('XLEN', KEYS[6]) > 0 then
      res = redis.call('XREADGROUP', 'GROUP', ARGV[8], ARGV[1], 'COUNT', n, 'STREAMS', KEYS[6], '>')
    end
    if res then
      for _, e in ipairs(res[1][2]) do out[#out + 1] = e[1]; out[#out + 1] = e[2] end
    end
  end
  return out
end)

-- variant U: lists, lease in the record, but today's unpacked record fields
local VIEWF = {'runId', 'status', 'cancel', 'attempt', 'maxAttempts', 'token', 'sources', 'stages', 'done',
  'waiting', 'cursor', 'startedAt', 'leaseUntil'}
redis.register_function('leanU_submit', function(KEYS, ARGV)
  local now = clock()
  local rec, src = KEYS[1], ARGV[3]
  local f = redis.call('HMGET', rec, 'c:' .. src .. ':joined', 'n:' .. src .. ':joined', 'status', 'runId', 'updatedAt', 'v')
  if f[3] then return {'exists'} end
  redis.call('HSET', rec, 'key', ARGV[1], 'runId', ARGV[2], 'status', 'queued', 'stages', ARGV[4],
    'maxAttempts', ARGV[5], 'sources', src, 'requestedAt', now, 'updatedAt', now, 'entry', ARGV[2])
  redis.call('RPUSH', KEYS[4], ARGV[2] .. US .. ARGV[1] .. US .. src)
  hist(KEYS[2], 50, ev(now, 'requested', ARGV[2], src, '', 'started', '', ''))
  redis.call('ZADD', KEYS[3], now, ARGV[1])
  if redis.call('EXISTS', KEYS[5]) == 1 then redis.call('PUBLISH', 'x', 'v') end
  return {'started', now}
end)
redis.register_function('leanU_claim', function(KEYS, ARGV)
  local now, now_us = clock()
  local entry = ARGV[1]
  redis.call('ZREM', KEYS[1], entry)
  local e = unpackh(entry)
  local r = redis.call('HMGET', KEYS[3], unpack(VIEWF))
  if r[1] ~= e[1] or r[2] ~= 'queued' then return {'ack'} end
  if r[13] and tonumber(r[13]) > tonumber(now) then return {'busy'} end
  local token = next_token(r[6], now_us)
  local until_ms = now + tonumber(ARGV[3])
  local stage = first_stage(r[8])
  local attempt = (tonumber(r[4]) or 0) + 1
  redis.call('HSET', KEYS[3], 'status', 'running', 'stage', stage, 'owner', ARGV[2], 'token', token,
    'updatedAt', now, 'attempt', attempt, 'entry', entry, 'lane', 'b', 'startedAt', now, 'leaseUntil', until_ms, 'v', '')
  redis.call('ZADD', KEYS[2], until_ms, e[2])
  hist(KEYS[4], 50, ev(now, 'started', e[1], e[3], stage, '', ARGV[2], token))
  if redis.call('EXISTS', KEYS[5]) == 1 then redis.call('PUBLISH', 'x', 'v') end
  return {'granted', token, r[9] or 0, '', attempt, r[8], r[7], now, 'queued'}
end)
redis.register_function('leanU_finish', function(KEYS, ARGV)
  local now = clock()
  local r = redis.call('HMGET', KEYS[1], 'runId', 'token', 'stage', 'stages', 'done', 'followUp', 'cancel', 'lastError', 'owner', 'leaseUntil')
  if r[1] ~= ARGV[3] or r[2] ~= ARGV[2] or r[9] ~= ARGV[1] or tonumber(r[10]) < tonumber(now) then return {0} end
  redis.call('HSET', KEYS[1], 'status', 'done', 'finishedAt', now, 'updatedAt', now, 'entry', '', 'stage', '',
    'lastSuccessAt', now, 'done', (tonumber(r[5]) or 0) + 1, 'cursor', '', 'leaseUntil', '', 'v', '')
  return done_and_next(KEYS, ARGV, now, r[3], 'v')
end)

-- variant K: the unpacked lean path with a lease key (GET, SET PX, DEL) instead of the lease in the record
redis.register_function('leanK_claim', function(KEYS, ARGV)
  local now, now_us = clock()
  local entry = ARGV[1]
  redis.call('ZREM', KEYS[1], entry)
  local e = unpackh(entry)
  local r = redis.call('HMGET', KEYS[3], unpack(VIEWF))
  if r[1] ~= e[1] or r[2] ~= 'queued' then return {'ack'} end
  local lease = KEYS[3] .. ':lease'
  if redis.call('GET', lease) then return {'busy'} end
  local token = next_token(r[6], now_us)
  local stage = first_stage(r[8])
  local attempt = (tonumber(r[4]) or 0) + 1
  redis.call('SET', lease, token .. '|' .. ARGV[2], 'PX', ARGV[3])
  redis.call('HSET', KEYS[3], 'status', 'running', 'stage', stage, 'owner', ARGV[2], 'token', token,
    'updatedAt', now, 'attempt', attempt, 'entry', entry, 'lane', 'b', 'startedAt', now, 'v', '')
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), e[2])
  hist(KEYS[4], 50, ev(now, 'started', e[1], e[3], stage, '', ARGV[2], token))
  if redis.call('EXISTS', KEYS[5]) == 1 then redis.call('PUBLISH', 'x', 'v') end
  return {'granted', token, r[9] or 0, '', attempt, r[8], r[7], now, 'queued'}
end)
redis.register_function('leanK_finish', function(KEYS, ARGV)
  local now = clock()
  local lease = KEYS[1] .. ':lease'
  if redis.call('GET', lease) ~= ARGV[2] .. '|' .. ARGV[1] then return {0} end
  local r = redis.call('HMGET', KEYS[1], 'runId', 'token', 'stage', 'stages', 'done', 'followUp', 'cancel', 'lastError')
  if r[1] ~= ARGV[3] or r[2] ~= ARGV[2] then return {0} end
  redis.call('DEL', lease)
  redis.call('HSET', KEYS[1], 'status', 'done', 'finishedAt', now, 'updatedAt', now, 'entry', '', 'stage', '',
    'lastSuccessAt', now, 'done', (tonumber(r[5]) or 0) + 1, 'cursor', '', 'v', '')
  return done_and_next(KEYS, ARGV, now, r[3], 'v')
end)
`

func BenchmarkLeanPathRun(b *testing.B) {
	b.Run("packed", func(b *testing.B) { benchLean(b, "lean") })
	b.Run("unpacked", func(b *testing.B) { benchLean(b, "leanU") })
	b.Run("leasekey", func(b *testing.B) { benchLean(b, "leanK") })
}

func benchLean(b *testing.B, fn string) {
	srv := benchutil.Server(b)
	rdb := benchutil.Client(b, srv.Addr(), 4)
	ctx := context.Background()
	if err := rdb.FunctionLoadReplace(ctx, leanLib).Err(); err != nil {
		b.Fatal(err)
	}
	p := "{p0}"
	lanep, laneb, taken, running, index, watch := p+":qp", p+":qb", p+":taken", p+":running", p+":index", p+":watch"
	key := func(i int) string { return "s" + strconv.Itoa(i) + "|bench" }
	rec := func(i int) string { return p + ":task:" + key(i) }
	hist := func(i int) string { return p + ":hist:" + key(i) }
	submit := func(i int) {
		r, err := rdb.FCall(ctx, submitFn(fn), []string{rec(i), hist(i), index, laneb, watch},
			key(i), "run"+strconv.Itoa(i), "schedule", "fetch", 3).Slice()
		if err != nil || r[0] != "started" {
			b.Fatalf("submit %d: %v %v", i, r, err)
		}
	}
	// the entry of run i, as the previous run's finish read it
	submit(0)
	first, err := rdb.LPop(ctx, laneb).Result()
	if err != nil {
		b.Fatal(err)
	}
	rdb.ZAdd(ctx, taken, redis.Z{Score: 1, Member: first})
	entry := first
	b.ReportAllocs()
	m := startMeter(b, srv, rdb)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		submit(i + 1)
		c, err := rdb.FCall(ctx, fn+"_claim", []string{taken, running, rec(i), hist(i), watch}, entry, "bench/1", 30000).Slice()
		if err != nil || c[0] != "granted" {
			b.Fatalf("claim %d: %v %v", i, c, err)
		}
		f, err := rdb.FCall(ctx, fn+"_finish", []string{rec(i), hist(i), index, running, lanep, laneb, taken, watch},
			"bench/1", c[1], "run"+strconv.Itoa(i), key(i), "fetch", 1, 86400000).Slice()
		if err != nil || len(f) < 3 {
			b.Fatalf("finish %d: %v %v", i, f, err)
		}
		entry = f[2].(string)
	}
	b.StopTimer()
	m.report(b, "fcall")
}

func BenchmarkLeanPathStreamsRun(b *testing.B) {
	srv := benchutil.Server(b)
	rdb := benchutil.Client(b, srv.Addr(), 4)
	ctx := context.Background()
	if err := rdb.FunctionLoadReplace(ctx, leanLib).Err(); err != nil {
		b.Fatal(err)
	}
	p := "{p0}"
	sp, sb, running, index, watch := p+":sp", p+":sb", p+":running", p+":index", p+":watch"
	for _, s := range []string{sp, sb} {
		if err := rdb.XGroupCreateMkStream(ctx, s, "g", "$").Err(); err != nil {
			b.Fatal(err)
		}
	}
	key := func(i int) string { return "s" + strconv.Itoa(i) + "|bench" }
	rec := func(i int) string { return p + ":task:" + key(i) }
	hist := func(i int) string { return p + ":hist:" + key(i) }
	submit := func(i int) {
		r, err := rdb.FCall(ctx, "leanS_submit", []string{rec(i), hist(i), index, sb, watch},
			key(i), "run"+strconv.Itoa(i), "schedule", "fetch", 3).Slice()
		if err != nil || r[0] != "started" {
			b.Fatalf("submit %d: %v %v", i, r, err)
		}
	}
	submit(0)
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "bench/1", Streams: []string{sb, ">"}, Count: 1}).Result()
	if err != nil {
		b.Fatal(err)
	}
	entry := res[0].Messages[0].ID
	b.ReportAllocs()
	m := startMeter(b, srv, rdb)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		submit(i + 1)
		c, err := rdb.FCall(ctx, "leanS_claim", []string{running, rec(i), hist(i), watch}, "run"+strconv.Itoa(i), "schedule", "bench/1", 30000).Slice()
		if err != nil || c[0] != "granted" {
			b.Fatalf("claim %d: %v %v", i, c, err)
		}
		f, err := rdb.FCall(ctx, "leanS_finish", []string{rec(i), hist(i), index, running, sp, sb, watch},
			"bench/1", c[1], "run"+strconv.Itoa(i), key(i), entry, 1, 86400000, "g").Slice()
		if err != nil || len(f) < 3 {
			b.Fatalf("finish %d: %v %v", i, f, err)
		}
		entry = f[2].(string)
	}
	b.StopTimer()
	m.report(b, "fcall")
}

// submitFn: the lease-key variant submits as the unpacked one.
func submitFn(fn string) string {
	if fn == "leanK" {
		return "leanU_submit"
	}
	return fn + "_submit"
}
