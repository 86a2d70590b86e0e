// The server under load: more clients than sequence slots, with prompts that
// together exceed the KV cache. Requests that fit alone wait for room instead
// of failing, and each answer is the one the same request gets alone; a
// request that can never fit is refused up front.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, stopServers } from "./server.mjs";

after(stopServers);

const metric = async (base, name) =>
  Number((await (await fetch(`${base}/metrics`)).text()).match(new RegExp(`^${name} (\\d+)$`, "m"))[1]);

test("12 clients, 4 slots, a 512-token cache that holds two requests at a time: every answer is its answer alone", async () => {
  const s = await startServer(["--ctx", "512", "--parallel", "4"]);
  const c = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: "x", maxRetries: 0 });
  // about 150 prompt tokens and 60 generated (the end tokens banned): 210 of the 512
  const reqs = Array.from({ length: 12 }, (_, i) => ({
    model: "m",
    messages: [{ role: "user", content: `List ${i}: ` + Array.from({ length: 70 }, (_, j) => (j * (i + 3)) % 97).join(" ") }],
    max_tokens: 60,
    temperature: 0,
    logit_bias: { "151643": -100, "151645": -100 },
  }));
  const one = async (r) => {
    const out = await c.chat.completions.create(r);
    return [out.choices[0].message.content, out.usage.prompt_tokens, out.usage.completion_tokens];
  };
  const alone = [];
  for (const r of reqs) alone.push(await one(r));
  alone.forEach(([, p, n], i) => assert.ok(p > 100 && p + n <= 512 && n === 60, `request ${i}: ${p} + ${n} tokens`));
  assert.ok(alone.slice(0, 4).reduce((t, [, p, n]) => t + p + n, 0) > 512, "four slots' requests exceed the cache");
  const failed = await metric(s.base, "kapitsa_requests_failed_total");
  const together = await Promise.all(reqs.map(one));
  together.forEach((t, i) => assert.deepEqual(t, alone[i], `client ${i}`));
  assert.equal(await metric(s.base, "kapitsa_requests_failed_total"), failed, "no request failed");
  // a prompt and max_tokens beyond the whole cache: a 400 in the API's shape, at once
  const big = await fetch(`${s.base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...reqs[0], max_tokens: 400 }),
  });
  assert.equal(big.status, 400);
  assert.equal((await big.json()).error.type, "invalid_request_error");
  s.proc.kill("SIGTERM");
});
