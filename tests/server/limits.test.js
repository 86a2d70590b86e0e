// The limit on generated tokens, as each API names it (chat completions'
// max_tokens and max_completion_tokens, the Responses API's max_output_tokens,
// Anthropic's max_tokens): anything but an integer from 1 to 2^24 is a 400 in
// the API's own shape; 1 generates one token.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { startServer, stopServers } from "./server.mjs";

let srv;
before(async () => {
  srv = await startServer();
});
after(stopServers);

const msgs = [{ role: "user", content: "hi" }];
const apis = [
  { path: "/v1/chat/completions", field: "max_tokens", body: { model: "m", messages: msgs, temperature: 0, ignore_eos: true } },
  { path: "/v1/chat/completions", field: "max_completion_tokens", body: { model: "m", messages: msgs, temperature: 0, ignore_eos: true } },
  { path: "/v1/responses", field: "max_output_tokens", body: { model: "m", input: "hi", temperature: 0, ignore_eos: true } },
  { path: "/v1/messages", field: "max_tokens", body: { model: "m", messages: msgs, temperature: 0, ignore_eos: true } },
];

async function post(path, body) {
  const r = await fetch(`${srv.base}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: r.status, json: await r.json() };
}

for (const { path, field, body } of apis) {
  test(`${path} ${field}: out of range or not an integer is a 400 in the API's shape; 1 makes one token`, async () => {
    for (const bad of [0, -1, 2.5, "8", 2 ** 24 + 1]) {
      const r = await post(path, { ...body, [field]: bad });
      assert.equal(r.status, 400, `${field} ${JSON.stringify(bad)}`);
      if (path === "/v1/messages") {
        assert.equal(r.json.type, "error");
        assert.equal(r.json.error.type, "invalid_request_error");
      } else {
        assert.equal(r.json.error.type, "invalid_request_error");
      }
      assert.match(r.json.error.message, new RegExp(path === "/v1/chat/completions" ? "max_tokens" : field));
    }
    const ok = await post(path, { ...body, [field]: 1 });
    assert.equal(ok.status, 200, JSON.stringify(ok.json));
    const used = ok.json.usage;
    assert.equal(used.completion_tokens ?? used.output_tokens, 1);
  });
}
