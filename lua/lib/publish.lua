-- lib/publish.lua: what subscribers see — a record's view on its
-- partition's events channel, and cancels on the cancel channel.

-- PUBLISH_CMD publishes views and cancels: PUBLISH, or SPUBLISH (sharded
-- pub/sub: a message goes only to the shard of its channel's slot) in the
-- Functions library built for Redis Cluster (lua.NewLibrary).
local PUBLISH_CMD = 'PUBLISH'

-- publish_view publishes the task record (minus the binary cursor) as JSON
-- on the partition's channel; subscribers turn it into a TaskView. It is
-- skipped while watch_key is absent: subscribers (Registry.Subscribe) keep
-- that key alive, and encoding views nobody reads costs a third of a
-- script's time. watch_key nil: the caller checked it (publish).
local function publish_view(task_key, channel, watch_key)
  if watch_key and rcall('EXISTS', watch_key) == 0 then return end
  local flat = rcall('HGETALL', task_key)
  local view = {}
  for i = 1, #flat, 2 do
    local f = flat[i]
    local pre = ssub(f, 1, 2)
    if f ~= 'cursor' and f ~= 'co' and pre ~= 'c:' and pre ~= 'n:' then view[f] = flat[i + 1] end
  end
  rcall(PUBLISH_CMD, channel, cjson.encode(view))
end

-- publish publishes task_key's view (publish_view) for one script call
-- through w, a table the caller keeps for the call — w.events (channel),
-- w.watch (watch key) and w.watched (whether the watch key exists: nil
-- until asked, false or true after) — so the watch key's EXISTS is asked
-- once however many records the call publishes (it cannot change within
-- the call). The fields live in a table the caller has anyway (a claim's
-- c, a submit's partition), not in a closure: a closure per call costs
-- about as much as the EXISTS it saves.
local function publish(w, task_key)
  local watched = w.watched
  if watched == nil then
    watched = rcall('EXISTS', w.watch) == 1
    w.watched = watched
  end
  if watched then publish_view(task_key, w.events, nil) end
end

-- cancel_payload is what the cancel channel carries: "<task key> <runId>",
-- so a late message never stops a newer run of the key.
local function cancel_payload(key, run_id)
  return key .. ' ' .. run_id
end
