// The web page (GET /, its script and style), the JSON status its panel reads
// (GET /status), and --cors: without it no response carries CORS headers; with
// it every response names the origin and a preflight is answered without the key.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, stopServers } from "./server.mjs";

const ORIGIN = "http://page.example:8080";
const kflash = (process.env.KAPITSA_SERVE_ARGS || "").includes("--draft");
let srv;
before(async () => {
  srv = await startServer();
});
after(stopServers);

async function chat(base, headers = {}) {
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "Hello" }], max_tokens: 12, temperature: 0, ignore_eos: true }),
  });
  return { r, json: await r.json() };
}

test("GET / is the page, with its script and style, which run only from the server itself", async () => {
  const page = await fetch(`${srv.base}/`);
  assert.equal(page.status, 200);
  assert.match(page.headers.get("content-type"), /^text\/html/);
  assert.match(page.headers.get("content-security-policy"), /default-src 'self'/);
  const html = await page.text();
  assert.match(html, /<script src="app.js" defer><\/script>/);
  assert.match(html, /id="s-resident"/);
  const js = await fetch(`${srv.base}/app.js`);
  assert.equal(js.status, 200);
  assert.match(js.headers.get("content-type"), /^text\/javascript/);
  assert.match(await js.text(), /\/v1\/chat\/completions/);
  const css = await fetch(`${srv.base}/style.css`);
  assert.match(css.headers.get("content-type"), /^text\/css/);
  assert.equal((await fetch(`${srv.base}/index.html`)).status, 404, "only the page's own names");
  assert.equal((await fetch(`${srv.base}/../models/catalog.json`)).status, 404);
});

test("GET /status: model, memory, requests, resident conversations, rates", async () => {
  const before = await (await fetch(`${srv.base}/status`)).json();
  const { r } = await chat(srv.base);
  assert.equal(r.status, 200);
  const s = await (await fetch(`${srv.base}/status`)).json();
  assert.equal(s.model, before.model);
  assert.equal(s.device, "cpu");
  assert.equal(s.parallel, 4);
  assert.equal(s.memory.kv_cache_tokens, 4096);
  assert.ok(s.memory.weights_bytes > 0 && s.memory.resident_bytes > s.memory.weights_bytes / 10, JSON.stringify(s.memory));
  assert.ok(s.memory.kv_cache_bytes > 0);
  assert.equal(s.requests.total, before.requests.total + 1);
  assert.equal(s.requests.active, 0);
  assert.equal(s.tokens.generated, before.tokens.generated + 12);
  // the finished conversation stays in the KV cache: its prompt and 11 of its 12 tokens
  assert.ok(s.resident.conversations >= 1 && s.resident.tokens >= 11 + 5, JSON.stringify(s.resident));
  assert.ok(s.tok_s.prefill > 0 && s.tok_s.decode > 0, JSON.stringify(s.tok_s));
  if (kflash) assert.ok(s.kflash.passes > 0 && s.kflash.tokens_per_pass >= 1, JSON.stringify(s.kflash));
  else assert.equal(s.kflash, null);
  assert.equal((await fetch(`${srv.base}/status`, { method: "POST" })).status, 405);
});

test("without --cors no response carries CORS headers, and OPTIONS is no preflight", async () => {
  for (const path of ["/", "/v1/models", "/status"]) {
    const r = await fetch(`${srv.base}${path}`, { headers: { origin: ORIGIN } });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get("access-control-allow-origin"), null, path);
  }
  const { r } = await chat(srv.base, { origin: ORIGIN });
  assert.equal(r.headers.get("access-control-allow-origin"), null);
  const pre = await fetch(`${srv.base}/v1/chat/completions`, {
    method: "OPTIONS",
    headers: { origin: ORIGIN, "access-control-request-method": "POST" },
  });
  assert.notEqual(pre.status, 204);
  assert.equal(pre.headers.get("access-control-allow-origin"), null);
  assert.equal(pre.headers.get("access-control-allow-methods"), null);
});

test("--cors ORIGIN: preflights answered without the key, every response names the origin", async () => {
  const s = await startServer(["--cors", ORIGIN, "--api-key", "k3y"]);
  const pre = await fetch(`${s.base}/v1/messages`, {
    method: "OPTIONS",
    headers: { origin: ORIGIN, "access-control-request-method": "POST", "access-control-request-headers": "x-api-key, anthropic-version, x-stainless-os" },
  });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get("access-control-allow-origin"), ORIGIN);
  assert.match(pre.headers.get("access-control-allow-methods"), /\bPOST\b/);
  const allowed = pre.headers.get("access-control-allow-headers").split(/,\s*/);
  for (const h of ["authorization", "x-api-key", "anthropic-version", "content-type", "x-stainless-os"])
    assert.ok(allowed.includes(h), `${h} in ${allowed}`);
  // a refusal too, so that the page's script can read why
  const denied = await fetch(`${s.base}/v1/models`, { headers: { origin: ORIGIN } });
  assert.equal(denied.status, 401);
  assert.equal(denied.headers.get("access-control-allow-origin"), ORIGIN);
  const { r, json } = await chat(s.base, { origin: ORIGIN, authorization: "Bearer k3y" });
  assert.equal(r.status, 200, JSON.stringify(json));
  assert.equal(r.headers.get("access-control-allow-origin"), ORIGIN);
  // a stream's response too
  const stream = await fetch(`${s.base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", origin: ORIGIN, "x-api-key": "k3y" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "Hi" }], max_tokens: 3, stream: true }),
  });
  assert.equal(stream.headers.get("access-control-allow-origin"), ORIGIN);
  assert.match(await stream.text(), /data: \[DONE\]/);
  // the page needs no key (it holds nothing of the server's), what it shows does
  assert.equal((await fetch(`${s.base}/`)).status, 200);
  assert.equal((await fetch(`${s.base}/status`)).status, 401);
  assert.equal((await fetch(`${s.base}/status`, { headers: { "x-api-key": "k3y" } })).status, 200);
  s.proc.kill("SIGTERM");
});
