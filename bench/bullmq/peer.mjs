// The BullMQ side of tasklease's bench: `node peer.mjs <workload> '<json>'`,
// run by the Go bench (bench/bullmq.go) on its private Redis. It prints one
// JSON object on stdout when done; the idle workload prints {"ready":true}
// once its workers wait and stops when stdin closes. Redis-side figures
// (commands, CPU, memory, connections) are measured by the Go bench.
//
// Workloads (args: {"addr": "127.0.0.1:port", ...}):
//   submit_hot {requests, keys, clients}: Queue.add with deduplication.id
//     = the key, from `clients` concurrent callers, nothing consuming;
//     {per_s, waiting}.
//   e2e {jobs, concurrency, removeOnComplete}: `jobs` no-op jobs loaded
//     with addBulk, then one Worker of `concurrency` runs them; {per_s}
//     from the worker's start to the last completion, {load_per_s}.
//   pickup {samples}: an idle Worker; each sample adds one job a random
//     2-5 ms after the previous one started; {latencies_ms}.
//   idle {workers}: `workers` idle Workers (one Queue name), each with
//     connections of its own, as separate pods have.
import { Queue, Worker } from 'bullmq';
import { createInterface } from 'node:readline';

const [workload, raw] = process.argv.slice(2);
const args = JSON.parse(raw || '{}');
const [host, port] = args.addr.split(':');
const connection = { host, port: Number(port), maxRetriesPerRequest: null, connectionName: 'bench-pod' };
const name = 'sync';

const now = () => Number(process.hrtime.bigint()) / 1e6; // ms

async function submitHot({ requests, keys, clients }) {
  const q = new Queue(name, { connection });
  await q.waitUntilReady();
  let next = 0;
  const t0 = now();
  await Promise.all(Array.from({ length: clients }, async () => {
    for (let i = next++; i < requests; i = next++) {
      const key = 'k' + (i % keys);
      await q.add(name, { key }, { deduplication: { id: key } });
    }
  }));
  const perS = requests / ((now() - t0) / 1000);
  const waiting = await q.getWaitingCount();
  await q.close();
  return { per_s: perS, waiting };
}

async function e2e({ jobs, concurrency, removeOnComplete }) {
  const q = new Queue(name, { connection });
  await q.waitUntilReady();
  const l0 = now();
  const batch = 1000;
  for (let i = 0; i < jobs; i += batch) {
    const bulk = [];
    for (let j = i; j < Math.min(i + batch, jobs); j++) {
      bulk.push({ name, data: { i: j }, opts: removeOnComplete ? { removeOnComplete: true } : {} });
    }
    await q.addBulk(bulk);
  }
  const loadPerS = jobs / ((now() - l0) / 1000);
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  const t0 = now();
  const w = new Worker(name, async () => {}, { connection, concurrency });
  w.on('completed', () => { if (++done === jobs) finish(); });
  await finished;
  const perS = jobs / ((now() - t0) / 1000);
  await w.close();
  const completed = removeOnComplete ? done : await q.getCompletedCount();
  await q.close();
  return { per_s: perS, load_per_s: loadPerS, completed };
}

async function pickup({ samples }) {
  const q = new Queue(name, { connection });
  await q.waitUntilReady();
  const waiters = new Map();
  const w = new Worker(name, async (job) => {
    const t = now();
    const resolve = waiters.get(job.data.id);
    if (resolve) resolve(t);
  }, { connection, concurrency: 50 });
  await w.waitUntilReady();
  await new Promise((r) => setTimeout(r, 300)); // idle: blocked on its marker
  const out = [];
  for (let i = 0; i < samples; i++) {
    const id = 'p' + i;
    const started = new Promise((resolve) => waiters.set(id, resolve));
    const t0 = now();
    await q.add(name, { id });
    out.push((await started) - t0);
    waiters.delete(id);
    await new Promise((r) => setTimeout(r, 2 + Math.random() * 3));
  }
  await w.close();
  await q.close();
  return { latencies_ms: out };
}

async function idle({ workers }) {
  const ws = [];
  for (let i = 0; i < workers; i++) {
    const w = new Worker(name, async () => {}, { connection, concurrency: 50 });
    await w.waitUntilReady();
    ws.push(w);
  }
  process.stdout.write(JSON.stringify({ ready: true }) + '\n');
  await new Promise((resolve) => createInterface({ input: process.stdin }).on('close', resolve));
  await Promise.all(ws.map((w) => w.close()));
  return { workers };
}

const run = { submit_hot: submitHot, e2e, pickup, idle }[workload];
if (!run) {
  process.stderr.write(`unknown workload ${workload}\n`);
  process.exit(2);
}
run(args).then((res) => {
  process.stdout.write(JSON.stringify(res) + '\n');
  process.exit(0);
}, (err) => {
  process.stderr.write(String(err && err.stack || err) + '\n');
  process.exit(1);
});
