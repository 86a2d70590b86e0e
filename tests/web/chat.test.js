// The web page in a real browser: Debian's chromium, headless, driven by
// puppeteer-core, loading the page from `kapitsa serve`. A message typed and
// sent streams its reply in (as the API answers the same request), the status
// panel fills from /status, the stop button ends a reply and the server
// counts it cancelled, model text that looks like HTML stays text, and a
// server with an API key gets it from the page's field.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import puppeteer from "puppeteer-core";
import { startServer, stopServers } from "../server/server.mjs";

const CHROMIUM = process.env.KAPITSA_CHROMIUM || "/usr/bin/chromium";
const PROMPT = "Say hello to the sea";
let srv, browser;
before(async () => {
  srv = await startServer();
  // --no-sandbox: the tests may run as root, where chromium's sandbox will not start
  browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
});
after(async () => {
  await browser?.close();
  stopServers();
});

// A page on the server; its chat requests get `extra` merged into their body
// (greedy, no end of sequence: a reply as long and as known as the test needs).
// Errors in its scripts, and what the Content-Security-Policy blocks, are collected.
async function open(extra = {}) {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
  await page.setRequestInterception(true);
  page.on("request", (req) => {
    if (!req.url().endsWith("/v1/chat/completions")) return req.continue();
    req.continue({ postData: JSON.stringify({ ...JSON.parse(req.postData()), ...extra }) });
  });
  await page.goto(`${srv.base}/`);
  await page.waitForSelector("body[data-status=ok]");
  return { page, errors };
}

async function sendMessage(page, text, maxTokens) {
  await page.type("#max-tokens", String(maxTokens));
  await page.type("#input", text);
  await page.keyboard.press("Enter");
}

const text = (page, sel) => page.$eval(sel, (e) => e.textContent);

test("a message sent from the page streams its reply in, and the status panel fills", async () => {
  const { page, errors } = await open({ temperature: 0, ignore_eos: true });
  assert.equal(await text(page, "#s-model"), "kapitsa-tiny");
  assert.equal(await text(page, "#s-kflash"), "off");
  await sendMessage(page, PROMPT, 24);
  await page.waitForSelector(".msg.assistant[data-state=done]", { timeout: 120000 });
  assert.equal(await text(page, ".msg.user"), PROMPT);
  // the same request through the API: the page shows its text, a fenced block as code
  const r = await fetch(`${srv.base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "kapitsa-tiny", messages: [{ role: "user", content: PROMPT }], max_tokens: 24, temperature: 0, ignore_eos: true }),
  });
  const want = (await r.json()).choices[0].message.content;
  const shown = await page.$eval(".msg.assistant > div", (e) => e.textContent);
  assert.equal(shown, want.replace(/^```[^\n]*(\n|$)/gm, ""));
  assert.equal((await page.$$(".msg.assistant pre > code")).length, (want.match(/^```/gm) || []).length ? 1 : 0);
  const chunks = Number(await page.$eval(".msg.assistant", (e) => e.dataset.chunks));
  assert.ok(chunks >= 12 && chunks <= 24, `${chunks} deltas rendered one by one`);
  // the panel, refreshed once the reply ended: the request, its conversation kept, the rates
  await page.waitForFunction(() => document.getElementById("s-requests").textContent.startsWith("2: 0 running"));
  assert.match(await text(page, "#s-resident"), /^[12], \d+ tokens cached$/);
  assert.match(await text(page, "#s-decode"), /^\d+\.\d tok\/s \(48 tokens generated\)$/);
  assert.match(await text(page, "#s-prefill"), /^\d+\.\d tok\/s/);
  assert.match(await text(page, "#s-memory"), /^\d+(\.\d\d)? [MG]B resident, \d+(\.\d\d)? [MG]B of weights$/);
  assert.match(await text(page, "#s-kv"), /^4096 tokens \(bf16\)/);
  assert.equal(await page.$eval("#send", (e) => e.disabled), false);
  assert.deepEqual(errors, []);
  await page.close();
});

test("the stop button ends a reply, the server counts it cancelled", async () => {
  const { page, errors } = await open({ temperature: 0, ignore_eos: true });
  const before = await (await fetch(`${srv.base}/status`)).json();
  await sendMessage(page, "Count to a thousand", 4000); // some ten seconds of tokens, no end before them
  await page.waitForFunction(() => Number(document.querySelector(".msg.assistant")?.dataset.chunks) >= 3);
  assert.equal(await page.$eval("#send", (e) => e.disabled), true, "no second message while one streams");
  await page.click("#stop");
  await page.waitForSelector(".msg.assistant[data-state=stopped]");
  assert.equal(await page.$eval("#send", (e) => e.disabled), false);
  assert.equal(await page.$eval("#stop", (e) => e.disabled), true);
  const cancelled = before.requests.cancelled + 1;
  await page.waitForFunction((n) => / 0 running, 0 queued, (\d+) cancelled/.exec(document.getElementById("s-requests").textContent)?.[1] == n,
    { timeout: 60000 }, cancelled);
  const after = await (await fetch(`${srv.base}/status`)).json();
  assert.ok(after.tokens.generated - before.tokens.generated < 4000, "the server stopped generating");
  assert.deepEqual(errors, []);
  await page.close();
});

test("model text that looks like HTML stays text; code blocks and inline code are elements", async () => {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.setRequestInterception(true);
  const reply = 'See <img src=x onerror="window.pwned=1"> and `<b>x</b>`:\n```html\n<script>window.pwned=2</script>\n```\n**done**';
  const sse = [...reply].map((ch) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: ch } }] })}\n\n`).join("") + "data: [DONE]\n\n";
  page.on("request", (req) => {
    if (!req.url().endsWith("/v1/chat/completions")) return req.continue();
    req.respond({ status: 200, contentType: "text/event-stream", body: sse });
  });
  await page.goto(`${srv.base}/`);
  await sendMessage(page, "x", 1);
  await page.waitForSelector(".msg.assistant[data-state=done]");
  const got = await page.$eval(".msg.assistant > div", (e) => ({
    html: e.innerHTML,
    elements: [...e.querySelectorAll("*")].map((x) => x.tagName.toLowerCase()),
    code: [...e.querySelectorAll("code")].map((x) => x.textContent),
    lang: e.querySelector("pre > code")?.dataset.lang,
  }));
  assert.deepEqual(got.elements, ["code", "pre", "code"], got.html);
  assert.deepEqual(got.code, ["<b>x</b>", "<script>window.pwned=2</script>"]);
  assert.equal(got.lang, "html");
  assert.equal(await page.evaluate(() => window.pwned), undefined);
  assert.match(await text(page, ".msg.assistant > div"), /^See <img src=x onerror="window.pwned=1"> and <b>x<\/b>:/);
  assert.deepEqual(errors, []);
  await page.close();
});

test("with --api-key the page asks for the key, and works once it is given", async () => {
  const s = await startServer(["--api-key", "k3y"]);
  const page = await browser.newPage();
  await page.goto(`${s.base}/`);
  await page.waitForSelector("#key-row:not([hidden])");
  assert.match(await text(page, "#s-error"), /API key/);
  await page.type("#key", "k3y");
  await page.keyboard.press("Tab"); // the field's change event
  await page.waitForSelector("body[data-status=ok]");
  assert.equal(await page.$eval("#s-error", (e) => e.hidden), true);
  await sendMessage(page, "Hi", 4);
  await page.waitForSelector(".msg.assistant[data-state=done]");
  assert.ok((await text(page, ".msg.assistant")).length > 0);
  await page.close();
  s.proc.kill("SIGTERM");
});
