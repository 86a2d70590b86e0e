// Requests checked before any work: roles, stream, stop strings, tool names,
// ignore_eos beside a full logit_bias, methods; the API key's edge cases; ids
// that differ from one start to the next; no leaks in the streamed paths
// (under the ASan build, LeakSanitizer reports at exit).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { startServer, stopServers, ROOT } from "./server.mjs";

const BIN = process.env.KAPITSA_BIN || `${ROOT}/build/kapitsa`;
let srv, client;
before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "unused", maxRetries: 0 });
});
after(stopServers);

const user = [{ role: "user", content: "hi" }];
const post = (path, body) =>
  fetch(`${srv.base}${path}`, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });

async function refused(r, what) {
  assert.equal(r.status, 400, what);
  const e = await r.json();
  return e;
}

test("roles outside the API's and a stream that is not a boolean get 400 in each API's shape", async () => {
  for (const role of ["wizard", ""]) {
    const e = await refused(await post("/v1/chat/completions", { messages: [{ role, content: "x" }] }), role);
    assert.equal(e.error.type, "invalid_request_error");
    assert.match(e.error.message, /role/);
    const r = await refused(await post("/v1/responses", { input: [{ type: "message", role, content: "x" }] }), role);
    assert.match(r.error.message, /role/);
  }
  for (const role of ["developer", "system"]) {
    const ok = await client.chat.completions.create({ model: "m", messages: [{ role, content: "Be brief." }, ...user], max_tokens: 1 });
    assert.equal(ok.choices.length, 1, role);
  }
  let e = await refused(await post("/v1/chat/completions", { messages: user, stream: "yes" }), "chat stream");
  assert.match(e.error.message, /stream/);
  e = await refused(await post("/v1/completions", { prompt: "x", stream: 1 }), "completions stream");
  assert.match(e.error.message, /stream/);
  e = await refused(await post("/v1/responses", { input: "x", stream: "yes" }), "responses stream");
  assert.match(e.error.message, /stream/);
  e = await refused(await post("/v1/messages", { max_tokens: 4, messages: user, stream: "yes" }), "anthropic stream");
  assert.equal(e.type, "error");
  assert.equal(e.error.type, "invalid_request_error");
  assert.match(e.error.message, /stream/);
});

test("stop strings are capped in length and count", async () => {
  const create = (stop) => client.chat.completions.create({ model: "m", messages: user, max_tokens: 2, stop });
  await assert.rejects(create(["x".repeat(1025)]), (e) => e.status === 400 && /stop/.test(e.message));
  await assert.rejects(create(Array.from({ length: 9 }, (_, i) => `s${i}`)), (e) => e.status === 400 && /stop/.test(e.message));
  await assert.rejects(create(""), (e) => e.status === 400 && /stop/.test(e.message));
  assert.equal((await create(["x".repeat(1024)])).choices.length, 1);
  const ant = new Anthropic({ baseURL: srv.base, apiKey: "unused", maxRetries: 0 });
  await assert.rejects(ant.messages.create({ model: "m", max_tokens: 2, messages: user, stop_sequences: ["y".repeat(5000)] }),
    (e) => e.status === 400 && /stop/.test(e.message));
});

test("a tool name too long is refused before the prompt is tokenized", async () => {
  const tool = (name) => ({ type: "function", function: { name, parameters: { type: "object", properties: {} } } });
  // the prompt alone overflows the 4096-token context: an answer about the
  // tool's name shows that the cheap check came before the tokenizer
  const long = [{ role: "user", content: "hello ".repeat(6000) }];
  await assert.rejects(client.chat.completions.create({ model: "m", messages: long, tools: [tool("t".repeat(100000))], max_tokens: 2 }),
    (e) => e.status === 400 && /name of 1 to 128 bytes/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: "m", messages: long, tools: [tool("ok")], max_tokens: 2 }),
    (e) => e.status === 400 && /context/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: "m", messages: user, max_tokens: 4096 }),
    (e) => e.status === 400 && /context/.test(e.message));
  const r = await client.chat.completions.create({ model: "m", messages: user, tools: [tool("t".repeat(128))], max_tokens: 2 });
  assert.equal(r.choices.length, 1);
});

test("ignore_eos is refused, not dropped, when logit_bias leaves no room for the end tokens", async () => {
  const full = Object.fromEntries(Array.from({ length: 300 }, (_, i) => [String(i + 10), 1]));
  const r = await post("/v1/chat/completions", { messages: user, max_tokens: 2, logit_bias: full, ignore_eos: true });
  const e = await refused(r, "ignore_eos beside 300 biases");
  assert.match(e.error.message, /ignore_eos/);
  const ok = await post("/v1/chat/completions", { messages: user, max_tokens: 2, logit_bias: full });
  assert.equal(ok.status, 200);
  const few = Object.fromEntries(Array.from({ length: 10 }, (_, i) => [String(i + 10), 1]));
  const eos = await (await post("/v1/chat/completions", { messages: user, max_tokens: 6, temperature: 0, logit_bias: few, ignore_eos: true })).json();
  assert.equal(eos.usage.completion_tokens, 6, "ignore_eos still generates max_tokens");
});

test("wrong methods on /v1/models and /metrics get 405", async () => {
  for (const [method, path] of [["POST", "/v1/models"], ["DELETE", "/v1/models"], ["POST", "/metrics"], ["PUT", "/metrics"]]) {
    const r = await fetch(`${srv.base}${path}`, { method });
    assert.equal(r.status, 405, `${method} ${path}`);
    assert.equal((await r.json()).error.type, "invalid_request_error");
  }
  assert.equal((await fetch(`${srv.base}/v1/models`)).status, 200);
  assert.equal((await fetch(`${srv.base}/metrics`)).status, 200);
});

// Runs `kapitsa serve` with args until it exits or prints its banner; its stderr.
function serveLog(args) {
  return new Promise((resolve) => {
    const p = spawn(BIN, ["serve", "--port", "0", "--ctx", "512", "--parallel", "1", ...args], { cwd: ROOT, stdio: ["ignore", "ignore", "pipe"] });
    let log = "";
    p.stderr.on("data", (d) => {
      log += d;
      if (/kapitsa: serving /.test(log)) p.kill("SIGTERM");
    });
    p.on("exit", (code) => resolve({ code, log }));
  });
}

test("an empty --api-key is refused; a non-loopback host without a key warns", async () => {
  const empty = await serveLog(["--api-key", ""]);
  assert.equal(empty.code, 1);
  assert.match(empty.log, /API key is empty/);
  const open = await serveLog(["--host", "0.0.0.0"]);
  assert.match(open.log, /warning: listening on 0\.0\.0\.0 without --api-key/);
  const keyed = await serveLog(["--host", "0.0.0.0", "--api-key", "k"]);
  assert.doesNotMatch(keyed.log, /warning/);
  const local = await serveLog([]);
  assert.doesNotMatch(local.log, /warning/);
});

test("the Authorization scheme is case-insensitive", async () => {
  const s = await startServer(["--api-key", "s3cret"]);
  for (const scheme of ["Bearer", "bearer", "BEARER"]) {
    const r = await fetch(`${s.base}/v1/models`, { headers: { authorization: `${scheme} s3cret` } });
    assert.equal(r.status, 200, scheme);
  }
  assert.equal((await fetch(`${s.base}/v1/models`, { headers: { authorization: "bearer wrong" } })).status, 401);
  s.proc.kill("SIGTERM");
});

test("response ids differ from one start of the server to the next", async () => {
  const ids = [];
  for (let i = 0; i < 2; i++) {
    const s = await startServer();
    const c = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: "unused", maxRetries: 0 });
    ids.push((await c.chat.completions.create({ model: "m", messages: user, max_tokens: 1 })).id);
    s.proc.kill("SIGTERM");
  }
  assert.match(ids[0], /^chatcmpl-[0-9a-f]{16}$/);
  assert.notEqual(ids[0], ids[1]);
});

test("streamed completions and streamed tool calls leak nothing (LeakSanitizer at exit under ASan)", async () => {
  const s = await startServer();
  const c = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: "unused", maxRetries: 0 });
  for await (const _ of await c.completions.create({ model: "m", prompt: "Once", max_tokens: 3, stream: true }));
  // the forced call follows the schema: a bounded city, so the tiny model finishes the call
  const tools = [{ type: "function", function: { name: "get_weather",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 20 } }, required: ["city"] } } }];
  let calls = 0;
  const st = await c.chat.completions.create({ model: "m", messages: [{ role: "user", content: "What's the weather in Paris?" }],
    tools, tool_choice: "required", max_tokens: 100, temperature: 0, stream: true });
  for await (const ch of st) calls += ch.choices[0]?.delta?.tool_calls?.length ?? 0;
  assert.ok(calls > 0, "a streamed tool call");
  const code = await new Promise((resolve) => {
    s.proc.on("exit", (code) => resolve(code));
    s.proc.kill("SIGTERM");
  });
  assert.doesNotMatch(s.log(), /LeakSanitizer|ERROR: AddressSanitizer/, s.log().slice(-3000));
  assert.equal(code, 0);
});
