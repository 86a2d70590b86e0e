// The server driven by LangChain JS over real HTTP: ChatOpenAI (chat completions
// and the Responses API) and ChatAnthropic, each through invoke, stream,
// bindTools and withStructuredOutput. The tiny model writes nonsense, so the
// checks are on shapes: finish reasons, usage, tool calls and objects the zod
// schemas accept, streamed equal to whole when greedy.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { ChatOpenAI } from "@langchain/openai";
import { ChatAnthropic } from "@langchain/anthropic";
import { tool } from "@langchain/core/tools";
import { HumanMessage, ToolMessage } from "@langchain/core/messages";
import { z } from "zod";
import { startServer, stopServers } from "./server.mjs";

let base;
before(async () => {
  base = (await startServer()).base;
});
after(stopServers);

const models = (opts) => [
  ["ChatOpenAI", new ChatOpenAI({ model: "m", apiKey: "unused", configuration: { baseURL: `${base}/v1` }, maxRetries: 0, ...opts })],
  ["ChatOpenAI responses", new ChatOpenAI({ model: "m", apiKey: "unused", configuration: { baseURL: `${base}/v1` }, maxRetries: 0, useResponsesApi: true, ...opts })],
  ["ChatAnthropic", new ChatAnthropic({ model: "m", apiKey: "unused", anthropicApiUrl: base, maxRetries: 0, ...opts })],
];

const Weather = z.object({ city: z.string().max(20), days: z.number().int().min(1).max(7), unit: z.enum(["c", "f"]) });
const Pet = z.object({
  name: z.string().max(12),
  age: z.number().int().min(0).max(30),
  kind: z.enum(["cat", "dog", "fish"]),
  owner: z.object({ city: z.string().max(12) }),
});

const weather = tool(async () => JSON.stringify({ temperature: 21 }), { name: "weather", description: "The weather of a city", schema: Weather });

test("invoke and stream: text, usage and a finish reason; the stream's chunks add up to the whole answer when greedy", async () => {
  for (const [name, model] of models({ temperature: 0, maxTokens: 12 })) {
    const m = await model.invoke("Say hello.");
    assert.equal(typeof m.text, "string", name);
    assert.ok(m.usage_metadata.input_tokens > 5 && m.usage_metadata.output_tokens >= 1 && m.usage_metadata.output_tokens <= 12, `${name}: ${JSON.stringify(m.usage_metadata)}`);
    assert.equal(m.usage_metadata.total_tokens, m.usage_metadata.input_tokens + m.usage_metadata.output_tokens, name);
    let whole;
    for await (const chunk of await model.stream("Say hello.")) whole = whole ? whole.concat(chunk) : chunk;
    assert.equal(whole.text, m.text, name);
    assert.deepEqual(whole.usage_metadata.output_tokens, m.usage_metadata.output_tokens, name);
  }
});

test("bindTools with the tool forced: one call whose args the schema accepts, answered with a ToolMessage for the next turn", async () => {
  for (const [name, model] of models({ temperature: 0, maxTokens: 200 })) {
    // LangChain's Responses path sends a named tool_choice only (it drops "required")
    const choice = { ChatOpenAI: "required", "ChatOpenAI responses": "weather", ChatAnthropic: "any" }[name];
    const bound = model.bindTools([weather], { tool_choice: choice });
    const q = new HumanMessage("What is the weather in Paris?");
    const m = await bound.invoke([q]);
    assert.equal(m.tool_calls.length, 1, `${name}: ${JSON.stringify(m)}`);
    assert.equal(m.tool_calls[0].name, "weather", name);
    Weather.parse(m.tool_calls[0].args);
    const result = await weather.invoke(m.tool_calls[0]);
    assert.ok(result instanceof ToolMessage, name);
    // the next turn: the call and its result sent back, the tool forced again
    const m2 = await bound.invoke([q, m, result]);
    assert.equal(m2.tool_calls.length, 1, name);
    Weather.parse(m2.tool_calls[0].args);
    // streamed: the call's chunks add up to a call the schema accepts
    let whole;
    for await (const chunk of await bound.stream([q])) whole = whole ? whole.concat(chunk) : chunk;
    assert.equal(whole.tool_calls.length, 1, name);
    Weather.parse(whole.tool_calls[0].args);
  }
});

test("withStructuredOutput: an object the zod schema accepts (ints, an enum, nested), greedy and sampled", async () => {
  for (const temperature of [0, 1])
    for (const [name, model] of models({ temperature, maxTokens: 300 })) {
      const pet = await model.withStructuredOutput(Pet).invoke("Describe a pet.");
      Pet.parse(pet);
      const { raw, parsed } = await model.withStructuredOutput(Pet, { includeRaw: true }).invoke("Describe a pet.");
      Pet.parse(parsed);
      assert.ok(raw.usage_metadata.output_tokens > 0, name);
    }
});
