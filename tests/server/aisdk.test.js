// The server driven by the Vercel AI SDK over real HTTP, each of its providers
// a user would point at us: @ai-sdk/openai-compatible, @ai-sdk/openai (chat and
// responses) and @ai-sdk/anthropic. The tiny model writes nonsense, so the checks
// are on shapes: finish reasons, usage, tool calls and objects the zod schemas
// accept, streamed equal to whole when greedy.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { generateText, streamText, generateObject, streamObject, tool, stepCountIs, Output } from "ai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { z } from "zod";
import { startServer, stopServers } from "./server.mjs";

let compat, openai, anthropic;
before(async () => {
  const srv = await startServer();
  compat = createOpenAICompatible({ name: "kapitsa", baseURL: `${srv.base}/v1`, apiKey: "unused", supportsStructuredOutputs: true, includeUsage: true });
  openai = createOpenAI({ baseURL: `${srv.base}/v1`, apiKey: "unused" });
  anthropic = createAnthropic({ baseURL: `${srv.base}/v1`, apiKey: "unused" });
});
after(stopServers);

// each provider's chat model; "m" names whatever the server serves
const chatModels = () => [["openai-compatible", compat.chatModel("m")], ["openai chat", openai.chat("m")],
  ["openai responses", openai.responses("m")], ["anthropic", anthropic("m")]];

// ints, an enum and a nested object with an array: the idioms zod users write
const Pet = z.object({
  name: z.string().max(12),
  age: z.number().int().min(0).max(30),
  kind: z.enum(["cat", "dog", "fish"]),
  owner: z.object({ city: z.string().max(12), visits: z.array(z.number().int()).max(3) }),
});

const Weather = z.object({ city: z.string().max(20), days: z.number().int().min(1).max(7), unit: z.enum(["c", "f"]) });

const usageOk = (u, max) => {
  assert.ok(u.inputTokens > 5, JSON.stringify(u));
  assert.ok(u.outputTokens >= 1 && u.outputTokens <= max, JSON.stringify(u));
};

test("generateText and streamText: each provider's text, finish reason and usage; streamed equals whole when greedy", async () => {
  for (const [name, model] of chatModels()) {
    const req = { model, prompt: "Say hello.", maxOutputTokens: 12, temperature: 0 };
    const whole = await generateText(req);
    assert.ok(["stop", "length"].includes(whole.finishReason), `${name}: ${whole.finishReason}`);
    usageOk(whole.usage, 12);
    const s = streamText(req);
    let text = "";
    for await (const delta of s.textStream) text += delta;
    assert.equal(text, whole.text, name);
    assert.equal(await s.finishReason, whole.finishReason, name);
    assert.deepEqual((await s.usage).outputTokens, whole.usage.outputTokens, name);
  }
});

test("generateObject and streamObject: an object the zod schema accepts (ints, an enum, nested), greedy and sampled", async () => {
  for (const [name, model] of chatModels())
    // sampled only where the provider sends the seed: Anthropic's API has none, so
    // an unseeded draw could spend max_tokens on reasoning before the forced call
    for (const [temperature, seed] of name === "anthropic" ? [[0, 1]] : [[0, 1], [1, 2]]) {
      const req = { model, schema: Pet, prompt: "Describe a pet.", maxOutputTokens: 300, temperature, seed };
      const r = await generateObject(req); // throws unless the object parses with Pet
      assert.equal(r.finishReason, "stop", name);
      Pet.parse(r.object);
      usageOk(r.usage, 300);
      const s = streamObject(req);
      // the whole stream's parts, so that a failure says what came (an error part, no object)
      let partials = 0;
      const parts = [];
      for await (const p of s.fullStream) {
        parts.push(p.type === "error" ? `error: ${p.error?.message ?? p.error}` : p.type);
        partials += p.type === "object" ? 1 : 0;
      }
      assert.ok(partials >= 1, `${name}, temperature ${temperature}: ${parts.join(", ")}`);
      Pet.parse(await s.object);
    }
});

test("generateText with Output.object: the structured result beside the text", async () => {
  for (const [name, model] of chatModels()) {
    const r = await generateText({ model, output: Output.object({ schema: Weather }), prompt: "The weather as JSON.", maxOutputTokens: 200, temperature: 0 });
    assert.equal(r.finishReason, "stop", name);
    assert.deepEqual(r.output, Weather.parse(JSON.parse(r.text)), name);
  }
});

test("a forced tool call in a multi-step loop: each step calls the tool with schema-valid input and gets its result back", async () => {
  for (const [name, model] of chatModels()) {
    const calls = [];
    const weather = tool({ description: "The weather of a city", inputSchema: Weather,
      execute: async (input) => (calls.push(input), { temperature: 21, sky: "clear" }) });
    const r = await generateText({ model, tools: { weather }, toolChoice: "required", stopWhen: stepCountIs(3),
      prompt: "What is the weather in Paris?", maxOutputTokens: 200, temperature: 0 });
    assert.equal(r.steps.length, 3, name);
    for (const step of r.steps) {
      assert.equal(step.finishReason, "tool-calls", name);
      assert.equal(step.toolCalls.length, 1, name);
      assert.equal(step.toolCalls[0].toolName, "weather");
      Weather.parse(step.toolCalls[0].input);
      assert.equal(step.toolResults.length, 1, name);
      assert.ok(step.usage.inputTokens > 0, name);
    }
    // each later step's prompt holds the earlier calls and results
    assert.ok(r.steps[2].usage.inputTokens > r.steps[1].usage.inputTokens && r.steps[1].usage.inputTokens > r.steps[0].usage.inputTokens, name);
    assert.equal(calls.length, 3, name);
    // a named tool, streamed
    const s = streamText({ model, tools: { weather }, toolChoice: { type: "tool", toolName: "weather" },
      prompt: "What is the weather in Rome?", maxOutputTokens: 200, temperature: 0 });
    const streamed = await s.toolCalls;
    assert.equal(streamed.length, 1, name);
    Weather.parse(streamed[0].input);
    assert.equal(await s.finishReason, "tool-calls", name);
  }
});

test("tool choice auto in a loop: every call of a strict tool parses, and the loop ends within its steps", async () => {
  for (const [name, model] of chatModels()) {
    // the AI SDK's Anthropic provider drops strict: there the model may call what it likes, which the SDK flags
    const strict = name !== "anthropic";
    const weather = tool({ description: "The weather of a city", inputSchema: Weather, strict: true,
      execute: async () => ({ temperature: 21 }) });
    const r = await generateText({ model, tools: { weather }, stopWhen: stepCountIs(3),
      prompt: "What is the weather in Paris?", maxOutputTokens: 120, temperature: 0 });
    assert.ok(r.steps.length >= 1 && r.steps.length <= 3, name);
    for (const step of r.steps) {
      assert.ok(["stop", "length", "tool-calls"].includes(step.finishReason), `${name}: ${step.finishReason}`);
      for (const c of step.toolCalls) if (strict || !c.invalid) Weather.parse(c.input);
      if (strict) assert.equal(step.content.filter((p) => p.type === "tool-error").length, 0, name);
    }
  }
});

test("the Responses provider's multi-turn conversation with its default store: item references continue it as the whole would", async () => {
  const turn1 = [{ role: "user", content: "Say hello." }];
  const req = { maxOutputTokens: 10, temperature: 0 };
  const a = await generateText({ model: openai.responses("m"), messages: turn1, ...req });
  const turn2 = [...turn1, ...a.response.messages, { role: "user", content: "And again." }];
  // store on (the default): the provider sends the assistant turn as an item_reference
  const stored = await generateText({ model: openai.responses("m"), messages: turn2, ...req });
  const whole = await generateText({ model: openai.responses("m"), messages: turn2, ...req, providerOptions: { openai: { store: false } } });
  assert.ok(stored.request.body.input.some((i) => i.type === "item_reference"), JSON.stringify(stored.request.body.input));
  assert.ok(!whole.request.body.input.some((i) => i.type === "item_reference"));
  assert.equal(stored.usage.inputTokens, whole.usage.inputTokens);
  assert.equal(stored.text, whole.text);
  // previousResponseId: only the new message is sent
  const byId = await generateText({ model: openai.responses("m"), messages: [{ role: "user", content: "And again." }], ...req,
    providerOptions: { openai: { previousResponseId: a.providerMetadata.openai.responseId } } });
  assert.equal(byId.usage.inputTokens, whole.usage.inputTokens);
  assert.equal(byId.text, whole.text);
});
