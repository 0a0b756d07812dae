// The seeded tutoring mix (M5) for k6, against the gateway's POST /answer.
//
//   k6 run -e TARGET=http://127.0.0.1:8080 --vus 20 --duration 15m loadtest/k6/tutoring.js
//
// k6 reads a response whole, it cannot time the first SSE event as it arrives. TTFT therefore
// comes from the stream's own `event: done` (`timings.time_to_first_token_ms`: arrival at the
// gateway to first token, measured by the gateway), beside k6's client-side
// `http_req_waiting` (time to first byte, i.e. the `meta` event) and `http_req_duration` (e2e).
import http from 'k6/http';
import { check } from 'k6';
import { Trend, Counter } from 'k6/metrics';

const CLASSES = [['small', 300, 120, 0.70], ['medium', 2000, 300, 0.25], ['large', 8000, 500, 0.05]];
const WORDS = 'why does my loop not end when i set the flag in the next call this code fn let map key'.split(' ');
const TARGET = __ENV.TARGET || 'http://127.0.0.1:8080';
const ttft = {};
for (const [name] of CLASSES) ttft[name] = new Trend(`ttft_${name}`, true);
const streamErrors = new Counter('stream_errors');

// Seeded (mulberry32), per VU: the same VUs replay the same requests.
function rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
let rand = null;

export default function () {
  if (rand === null) rand = rng(Number(__ENV.LOAD_SEED || 42) * 1000 + __VU);
  let r = rand();
  let cls = CLASSES[CLASSES.length - 1];
  for (const c of CLASSES) { r -= c[3]; if (r < 0) { cls = c; break; } }
  const [name, inp, out] = cls;
  const words = [];
  for (let i = 0; i < Math.max(1, inp - 10); i++) words.push(WORDS[Math.floor(rand() * WORDS.length)]);
  const body = JSON.stringify({ messages: [{ role: 'user', content: words.join(' ') }], max_output_tokens: out });
  const res = http.post(`${TARGET}/answer`, body, { headers: { 'Content-Type': 'application/json' }, tags: { class: name }, timeout: '600s' });
  const done = /event: done\ndata: (.*)\n/.exec(res.body || '');
  const ok = check(res, { 'status 200': (x) => x.status === 200, 'stream done': () => done !== null });
  if (!ok || (res.body || '').includes('event: error')) { streamErrors.add(1); return; }
  ttft[name].add(JSON.parse(done[1]).timings.time_to_first_token_ms);
}
