// The server driven by the official Anthropic SDK (what Claude Code speaks):
// messages with content blocks, the exact streaming event sequence, tool_use /
// tool_result turns, count_tokens, models, errors in Anthropic's shape, API key.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { betaZodTool } from "@anthropic-ai/sdk/helpers/beta/zod";
import { z } from "zod";
import { startServer, stopServers } from "./server.mjs";

let srv, client;
before(async () => {
  srv = await startServer(["--api-key", "k-123"]);
  client = new Anthropic({ baseURL: srv.base, apiKey: "k-123", maxRetries: 0 });
});
after(stopServers);

const TOOLS = [{ name: "read_file", description: "Read a file", input_schema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } }];

test("a message comes back with content blocks, stop_reason and usage", async () => {
  const m = await client.messages.create({
    model: "kapitsa-tiny", max_tokens: 16, temperature: 0, system: "Be brief.",
    messages: [{ role: "user", content: "Write a Python function." }],
  });
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.ok(["end_turn", "max_tokens"].includes(m.stop_reason));
  assert.ok(m.usage.input_tokens > 5 && m.usage.output_tokens <= 16);
  for (const b of m.content) assert.ok(["text", "thinking", "tool_use"].includes(b.type));
});

test("streaming follows the event sequence and equals the non-streamed message", async () => {
  const req = { model: "m", max_tokens: 24, temperature: 0, messages: [{ role: "user", content: [{ type: "text", text: "def add(a, b):" }] }] };
  const whole = await client.messages.create(req);
  const events = [];
  const stream = client.messages.stream(req);
  stream.on("streamEvent", (e) => events.push(e.type));
  const final = await stream.finalMessage();
  assert.equal(events[0], "message_start");
  assert.equal(events.at(-1), "message_stop");
  assert.equal(events.at(-2), "message_delta");
  // every block is started, gets deltas, and is stopped, in order
  let open = false;
  for (const e of events.slice(1, -2)) {
    if (e === "content_block_start") { assert.ok(!open); open = true; }
    else if (e === "content_block_stop") { assert.ok(open); open = false; }
    else if (e === "content_block_delta") assert.ok(open);
    else assert.equal(e, "ping");
  }
  assert.ok(!open);
  assert.deepEqual(final.content.map((b) => [b.type, b.text ?? b.thinking ?? b.name]),
                   whole.content.map((b) => [b.type, b.text ?? b.thinking ?? b.name]));
  assert.equal(final.stop_reason, whole.stop_reason);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
});

test("usage: a second request with the same prefix reads it from the cache; input_tokens leave the cached ones out", async () => {
  const long = "Kapitsa serves local models. ".repeat(40);
  const req = { model: "m", max_tokens: 4, temperature: 0, system: long, messages: [{ role: "user", content: "Say hi." }] };
  const first = await client.messages.create(req);
  const total = first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.cache_creation_input_tokens;
  const second = await client.messages.create({ ...req, messages: [{ role: "user", content: "Say hello." }] });
  assert.ok(second.usage.cache_read_input_tokens > 200, JSON.stringify(second.usage));
  const total2 = second.usage.input_tokens + second.usage.cache_read_input_tokens + second.usage.cache_creation_input_tokens;
  assert.ok(Math.abs(total2 - total) <= 4, `${total} then ${total2} prompt tokens`);
  assert.ok(second.usage.input_tokens < 40, JSON.stringify(second.usage));
});

test("usage streamed: message_start reads the cached prefix, and message_delta agrees", async () => {
  const long = "Streams report the cache as whole answers do. ".repeat(30);
  const req = (say) => ({ model: "m", max_tokens: 4, temperature: 0, system: long, messages: [{ role: "user", content: say }] });
  const streamed = async (r) => {
    let start;
    const stream = client.messages.stream(r);
    // a copy: the SDK's final message is message_start's, updated by message_delta
    stream.on("streamEvent", (e) => { if (e.type === "message_start") start = { ...e.message.usage }; });
    const final = await stream.finalMessage();
    return [start, final.usage];
  };
  const [n1, n2] = await Promise.all(["Say hi.", "Say yo."].map(async (say) => (await client.messages.countTokens(req(say))).input_tokens));
  assert.equal(n1, n2); // the two prompts differ in their last words only
  const [start1] = await streamed(req("Say hi."));
  const [start2, final2] = await streamed(req("Say yo."));
  assert.ok(start2.cache_read_input_tokens > 200, JSON.stringify(start2));
  assert.equal(start2.input_tokens + start2.cache_read_input_tokens, start1.input_tokens + start1.cache_read_input_tokens);
  assert.ok(start2.input_tokens < 40, JSON.stringify(start2));
  assert.deepEqual([final2.input_tokens, final2.cache_read_input_tokens, final2.cache_creation_input_tokens],
                   [start2.input_tokens, start2.cache_read_input_tokens, 0]);
  assert.ok(final2.output_tokens >= 1 && final2.output_tokens <= 4);
});

test("a tool_use / tool_result conversation is accepted", async () => {
  const m = await client.messages.create({
    model: "m", max_tokens: 8, tools: TOOLS,
    messages: [
      { role: "user", content: "Show main.c" },
      { role: "assistant", content: [{ type: "text", text: "Reading it." }, { type: "tool_use", id: "toolu_1", name: "read_file", input: { path: "main.c" } }] },
      { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: [{ type: "text", text: "int main(void) { return 0; }" }] }, { type: "text", text: "Explain." }] },
    ],
  });
  assert.ok(m.stop_reason);
  for (const b of m.content.filter((b) => b.type === "tool_use")) assert.equal(typeof b.input, "object");
});

test("count_tokens counts what the template renders", async () => {
  const a = await client.messages.countTokens({ model: "m", messages: [{ role: "user", content: "hi" }] });
  const b = await client.messages.countTokens({ model: "m", messages: [{ role: "user", content: "hi" }], tools: TOOLS });
  assert.ok(a.input_tokens > 3);
  assert.ok(b.input_tokens > a.input_tokens);
});

test("models.list works with the Anthropic SDK", async () => {
  const page = await client.models.list();
  assert.equal(page.data[0].id, "kapitsa-tiny");
});

test("errors come in Anthropic's shape and the server keeps serving", async () => {
  await assert.rejects(client.messages.create({ model: "m", messages: [{ role: "user", content: "x" }] }),
    (e) => e.status === 400 && e.error?.error?.type === "invalid_request_error" && /max_tokens/.test(e.message));
  await assert.rejects(client.messages.create({ model: "m", max_tokens: 4, messages: [{ role: "robot", content: "x" }] }), (e) => e.status === 400);
  await assert.rejects(client.messages.create({ model: "m", max_tokens: 4, top_p: 3, messages: [{ role: "user", content: "x" }] }), (e) => e.status === 400 && /top_p/.test(e.message));
  await assert.rejects(client.messages.create({ model: "m", max_tokens: 4, temperature: 1.5, messages: [{ role: "user", content: "x" }] }), (e) => e.status === 400 && /temperature/.test(e.message));
  await assert.rejects(client.messages.create({ model: "m", max_tokens: 4, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AA==" } }] }] }), (e) => e.status === 400 && /image/.test(e.message));
  const bad = new Anthropic({ baseURL: srv.base, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model: "m", max_tokens: 4, messages: [{ role: "user", content: "x" }] }),
    (e) => e.status === 401 && e.error?.error?.type === "authentication_error");
  const ok = await client.messages.create({ model: "m", max_tokens: 2, messages: [{ role: "user", content: "still there?" }] });
  assert.equal(ok.type, "message");
});

test("stop_sequences end the message and are reported", async () => {
  const req = { model: "m", max_tokens: 30, temperature: 0, messages: [{ role: "user", content: "Write a function" }] };
  const full = (await client.messages.create(req)).content.filter((b) => b.type === "text").map((b) => b.text).join("");
  assert.ok(full.length > 12);
  const stop = full.slice(8, 12);
  const m = await client.messages.create({ ...req, stop_sequences: [stop] });
  assert.equal(m.stop_reason, "stop_sequence");
  assert.equal(m.stop_sequence, stop);
  assert.equal(m.content.filter((b) => b.type === "text").map((b) => b.text).join(""), full.slice(0, full.indexOf(stop)));
});

test("tool_choice: none drops the tools from the prompt; any and a named tool force a call", async () => {
  // a forced call follows a tool's schema where it can: a bounded city and path, so the tiny model finishes the call
  const tools = [{ name: "get_weather", description: "Weather of a city",
    input_schema: { type: "object", properties: { city: { type: "string", maxLength: 20 } }, required: ["city"] } },
  { name: "read_file", description: "Read a file", input_schema: { type: "object", properties: { path: { type: "string", maxLength: 12 } } } }];
  const base = { model: "m", max_tokens: 4, temperature: 0, messages: [{ role: "user", content: "What's the weather in Paris?" }] };
  const none = await client.messages.create({ ...base, tools, tool_choice: { type: "none" } });
  const bare = await client.messages.create(base);
  const auto = await client.messages.create({ ...base, tools, tool_choice: { type: "auto" } });
  const prompt = (m) => m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens;
  assert.equal(prompt(none), prompt(bare));
  assert.ok(prompt(auto) > prompt(bare) + 20);
  const req = { ...base, tools, max_tokens: 100 };
  const use = (m) => {
    assert.equal(m.stop_reason, "tool_use");
    const blocks = m.content.filter((b) => b.type === "tool_use");
    assert.equal(blocks.length, 1);
    assert.ok(blocks[0].input && typeof blocks[0].input === "object");
    return blocks[0].name;
  };
  assert.ok(["get_weather", "read_file"].includes(use(await client.messages.create({ ...req, tool_choice: { type: "any" } }))));
  for (const name of ["get_weather", "read_file"])
    assert.equal(use(await client.messages.create({ ...req, tool_choice: { type: "tool", name } })), name);
  // streamed: a tool_use block whose input comes as input_json_delta
  const forced = { ...req, tool_choice: { type: "tool", name: "get_weather" } };
  const whole = (await client.messages.create(forced)).content.find((b) => b.type === "tool_use");
  const final = await client.messages.stream(forced).finalMessage();
  const streamed = final.content.find((b) => b.type === "tool_use");
  assert.deepEqual([streamed.name, streamed.input, final.stop_reason], [whole.name, whole.input, "tool_use"]);
  for (const [tc, re] of [[{ type: "tool", name: "delete_all" }, /not among/], [{ type: "tool" }, /name/], [{ type: "required" }, /tool_choice/]])
    await assert.rejects(client.messages.create({ ...req, tool_choice: tc }),
      (e) => e.status === 400 && e.error?.error?.type === "invalid_request_error" && re.test(e.message));
  await assert.rejects(client.messages.create({ ...base, tool_choice: { type: "any" } }), (e) => e.status === 400 && /no tools/.test(e.message));
  // a forced call comes at once, without a thinking block first, sampled or not; thinking with it is
  // refused as Anthropic refuses it
  for (const temperature of [0, 1]) {
    const m = await client.messages.create({ ...req, temperature, tool_choice: { type: "any" } });
    assert.equal(m.content[0].type, "tool_use", JSON.stringify(m.content));
  }
  await assert.rejects(client.messages.create({ ...req, max_tokens: 2048, thinking: { type: "enabled", budget_tokens: 1024 },
    tool_choice: { type: "any" } }), (e) => e.status === 400 && /Thinking may not be enabled/.test(e.message));
});

test("structured outputs: output_config.format and the beta's output_format give an object the schema describes", async () => {
  // the same bounded schema as the OpenAI json_schema test: the tiny model finishes it
  const schema = { type: "object", additionalProperties: false, required: ["ok", "color", "size", "kind"],
    properties: { ok: { type: "boolean" }, color: { enum: ["red", "green", "blue"] }, size: { enum: [1, 2, 3] }, kind: { const: "cat" } } };
  const fits = (v) => {
    assert.deepEqual(Object.keys(v), ["ok", "color", "size", "kind"]);
    assert.ok(typeof v.ok === "boolean" && ["red", "green", "blue"].includes(v.color) && [1, 2, 3].includes(v.size) && v.kind === "cat", JSON.stringify(v));
  };
  const base = { model: "m", max_tokens: 400, messages: [{ role: "user", content: "Describe a cat as JSON." }] };
  for (const temperature of [0, 1]) {
    const req = { ...base, temperature, output_config: { format: { type: "json_schema", schema } } };
    const m = await client.messages.create(req);
    assert.equal(m.stop_reason, "end_turn");
    assert.deepEqual(m.content.map((b) => b.type), ["text"]);
    fits(JSON.parse(m.content[0].text));
    if (temperature === 0) {
      const final = await client.messages.stream(req).finalMessage();
      assert.equal(final.content[0].text, m.content[0].text);
    }
  }
  // the SDK's own parse: it sends output_format to /v1/messages?beta=true with the structured-outputs beta header
  const parsed = await client.beta.messages.parse({ ...base, temperature: 0, output_format: { type: "json_schema", schema } });
  fits(parsed.parsed_output);
  const refused = async (extra, re) => assert.rejects(client.messages.create({ ...base, ...extra }),
    (e) => e.status === 400 && e.error?.error?.type === "invalid_request_error" && re.test(e.message));
  await refused({ output_config: { format: { type: "json_object" } } }, /json_schema/);
  await refused({ output_config: { format: { type: "json_schema" } } }, /schema/);
  await refused({ output_config: { format: { type: "json_schema", schema: { type: "object", properties: { s: { type: "string", pattern: "^a" } } } } } }, /pattern/);
  await refused({ output_format: { type: "json_schema", schema }, output_config: { format: { type: "json_schema", schema } } }, /one of them/);
  await refused({ output_format: { type: "json_schema", schema }, tools: TOOLS, tool_choice: { type: "any" } }, /cannot be combined/);
});

test("a forced call cut by max_tokens: stop_reason max_tokens and its text without markup", async () => {
  const req = { model: "m", temperature: 0, tools: TOOLS, tool_choice: { type: "any" }, messages: [{ role: "user", content: "Read main.c" }] };
  for (const stream of [false, true]) {
    const cut = stream ? await client.messages.stream({ ...req, max_tokens: 60 }).finalMessage() : await client.messages.create({ ...req, max_tokens: 60 });
    assert.equal(cut.stop_reason, "max_tokens");
    assert.ok(!cut.content.some((b) => b.type === "tool_use"));
    const text = cut.content.filter((b) => b.type === "text").map((b) => b.text).join("");
    assert.match(text, /^\{\s*"name":\s*"read_file"/);
    assert.ok(!text.includes("<tool_call>"), text);
  }
});

test("a strict tool's forced call gives an input its schema describes", async () => {
  const input_schema = { type: "object", additionalProperties: false, required: ["unit", "days"],
    properties: { unit: { enum: ["celsius", "fahrenheit"] }, days: { enum: [1, 2, 3] } } };
  const tools = [{ name: "get_weather", description: "Weather of Paris", strict: true, input_schema }, ...TOOLS];
  const req = { model: "m", max_tokens: 200, tools, tool_choice: { type: "tool", name: "get_weather" },
    messages: [{ role: "user", content: "What's the weather in Paris?" }] };
  for (const temperature of [0, 1]) {
    const m = await client.messages.create({ ...req, temperature });
    assert.equal(m.stop_reason, "tool_use");
    const use = m.content.filter((b) => b.type === "tool_use");
    assert.equal(use.length, 1);
    assert.deepEqual(Object.keys(use[0].input), ["unit", "days"], JSON.stringify(use[0].input));
    assert.ok(["celsius", "fahrenheit"].includes(use[0].input.unit) && [1, 2, 3].includes(use[0].input.days));
  }
  await assert.rejects(client.messages.create({ ...req, tools: [{ ...tools[0], input_schema: { type: "object", properties: { n: { type: "integer", minimum: 10, maximum: 1 } } } }] }),
    (e) => e.status === 400 && e.error?.error?.type === "invalid_request_error" && /range/.test(e.message));
});

test("tool_choice auto with a strict tool: each tool_use the model makes has an input its schema describes", async () => {
  const input_schema = { type: "object", additionalProperties: false, required: ["unit", "days"],
    properties: { unit: { enum: ["celsius", "fahrenheit"] }, days: { enum: [1, 2, 3] } } };
  const base = { model: "m", temperature: 0, max_tokens: 80, ignore_eos: true,
    tools: [{ name: "get_weather", strict: true, input_schema }],
    messages: [{ role: "user", content: "What is the weather like in London today?" }] };
  const m = await client.messages.create(base);
  const use = m.content.filter((b) => b.type === "tool_use");
  assert.ok(use.length >= 1, JSON.stringify(m.content));
  for (const u of use) {
    assert.equal(u.name, "get_weather");
    assert.deepEqual(Object.keys(u.input), ["unit", "days"], JSON.stringify(u.input));
    assert.ok(["celsius", "fahrenheit"].includes(u.input.unit) && [1, 2, 3].includes(u.input.days));
  }
  const free = await client.messages.create({ ...base, ignore_eos: false, temperature: 1, max_tokens: 60 });
  assert.ok(["end_turn", "tool_use", "max_tokens"].includes(free.stop_reason), free.stop_reason);
});

test("disable_parallel_tool_use: the message ends with the first tool_use", async () => {
  const tools = [{ name: "get_weather", input_schema: { type: "object", properties: { city: { type: "string" } } } }];
  const base = { model: "m", temperature: 0, max_tokens: 80, ignore_eos: true, tools,
    messages: [{ role: "user", content: "What is the weather like in London today?" }] };
  const on = await client.messages.create(base);
  assert.equal(on.usage.output_tokens, 80);
  assert.ok(on.content.some((b) => b.type === "tool_use"), JSON.stringify(on.content));
  const one = await client.messages.create({ ...base, tool_choice: { type: "auto", disable_parallel_tool_use: true } });
  assert.equal(one.stop_reason, "tool_use");
  assert.deepEqual(one.content.map((b) => b.type), ["tool_use"]);
  assert.ok(one.usage.output_tokens < 40);
});

test("message threads: a thread's create or continue gets thread_unsupported_request, which the SDK's toolRunner answers by sending the whole conversation", async () => {
  const msg = { model: "m", max_tokens: 4, messages: [{ role: "user", content: "hi" }] };
  for (const thread of [{ type: "create" }, { type: "continue", previous_message_id: "msg_x" }]) {
    const res = await fetch(`${srv.base}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-api-key": "k-123", "anthropic-version": "2023-06-01", "anthropic-beta": "message-threads-2026-08-12" },
      body: JSON.stringify({ ...msg, thread }),
    });
    assert.equal(res.status, 400);
    const body = await res.json();
    assert.equal(body.type, "error");
    assert.equal(body.error.type, "invalid_request_error");
    assert.equal(body.error.details.error_code, "thread_unsupported_request");
    assert.match(body.error.message, /thread/);
  }
  await assert.rejects(client.messages.create({ ...msg, thread: { type: "create" } }),
    (e) => e.status === 400 && e.error?.error?.details?.error_code === "thread_unsupported_request");
  const m = await client.messages.create({ ...msg, thread: null });
  assert.equal(m.type, "message");
});

test("toolRunner: its thread is refused as unsupported, it sends the whole conversation instead, runs the tool and ends with a message", async () => {
  const Weather = z.object({ city: z.string().max(20), days: z.number().int().min(1).max(7) });
  const calls = [];
  const weather = betaZodTool({ name: "weather", description: "The weather of a city", inputSchema: Weather,
    run: async (input) => (calls.push(Weather.parse(input)), "21 degrees") });
  const runner = client.beta.messages.toolRunner({ model: "m", max_tokens: 200, temperature: 0, max_iterations: 3,
    messages: [{ role: "user", content: "What is the weather in Paris?" }], tools: [weather], tool_choice: { type: "any" } });
  const turns = [];
  for await (const message of runner) turns.push(message);
  // the call forced each turn: three turns, each a tool_use whose result went back
  assert.equal(turns.length, 3);
  for (const m of turns) {
    assert.equal(m.stop_reason, "tool_use");
    assert.ok(m.usage.input_tokens + m.usage.cache_read_input_tokens > 0);
  }
  assert.equal(calls.length, 3);
  const roles = runner.params.messages.map((m) => m.role);
  assert.deepEqual(roles.slice(0, 5), ["user", "assistant", "user", "assistant", "user"]);
});
