// Kapitsa's page: a chat with the served model through /v1/chat/completions,
// streamed, and the server's status from /status every two seconds. Model text
// reaches the page only as text nodes (textContent), never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const turns = []; // the conversation each request sends: {role, content}
let model = "kapitsa"; // /status names the model served
let running = null; // the AbortController of the reply being streamed
let chat = 0; // New chat counts up: a reply stopped by it stays out of the next conversation

function apiHeaders() {
  const h = { "content-type": "application/json" };
  const key = localStorage.getItem("kapitsa-key");
  if (key) h.authorization = `Bearer ${key}`;
  return h;
}

// A 401 asks for the API key (kept in this browser's storage).
function needKey(message) {
  $("key-row").hidden = false;
  showError(message);
}

function showError(message) {
  $("s-error").hidden = !message;
  $("s-error").textContent = message || "";
}

// Text with `inline code` into el, as text nodes and <code> elements.
function inline(el, text) {
  text.split(/`([^`\n]+)`/).forEach((piece, i) => {
    if (i % 2) {
      const code = document.createElement("code");
      code.textContent = piece;
      el.append(code);
    } else if (piece) {
      el.append(piece);
    }
  });
}

// Markdown's fenced code blocks (```lang ... ```) as <pre><code>, the rest as
// text with inline code; a block still open while the reply streams shows as code.
function render(el, text) {
  el.replaceChildren();
  text.split(/^```/m).forEach((part, i) => {
    if (i % 2) {
      const nl = part.indexOf("\n");
      const pre = document.createElement("pre"), code = document.createElement("code");
      if (nl > 0) code.dataset.lang = part.slice(0, nl).trim();
      code.textContent = nl < 0 ? "" : part.slice(nl + 1).replace(/\n$/, "");
      pre.append(code);
      el.append(pre);
    } else {
      inline(el, i ? part.replace(/^[^\n]*\n?/, "") : part); // after a block: the rest of its closing line
    }
  });
}

function bubble(role) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  $("messages").append(div);
  return div;
}

function scrollDown() {
  $("messages").scrollTop = $("messages").scrollHeight;
}

// The API's error message from a failed response, whatever its shape.
async function errorOf(res) {
  try {
    const j = await res.json();
    return (j.error && j.error.message) || `HTTP ${res.status}`;
  } catch {
    return `HTTP ${res.status}`;
  }
}

function setRunning(controller) {
  running = controller;
  $("send").disabled = !!controller;
  $("stop").disabled = !controller;
}

// Sends the conversation and streams the reply into a new bubble: its
// data-state is streaming, then done, stopped (the stop button) or error;
// data-chunks counts the deltas rendered.
async function send(text) {
  const at = chat;
  turns.push({ role: "user", content: text });
  render(bubble("user"), text);
  const out = bubble("assistant"), thinking = document.createElement("details"), body = document.createElement("div");
  thinking.append(Object.assign(document.createElement("summary"), { textContent: "thinking" }));
  const thought = document.createElement("div");
  thinking.append(thought);
  thinking.hidden = true;
  out.append(thinking, body);
  out.dataset.state = "streaming";
  out.dataset.chunks = "0";
  const controller = new AbortController();
  setRunning(controller);
  const req = { model, messages: turns, stream: true };
  const max = parseInt($("max-tokens").value, 10);
  if (max > 0) req.max_tokens = max;
  let reply = "", reasoning = "";
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST", headers: apiHeaders(), body: JSON.stringify(req), signal: controller.signal,
    });
    if (!res.ok) {
      const message = await errorOf(res);
      if (res.status === 401) needKey(message);
      throw new Error(message);
    }
    const reader = res.body.getReader(), decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) { // one event; ": keep-alive" comments carry no data
        const event = buf.slice(0, end);
        buf = buf.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
          const chunk = JSON.parse(line.slice(6));
          if (chunk.error) throw new Error(chunk.error.message);
          const delta = (chunk.choices && chunk.choices[0] && chunk.choices[0].delta) || {};
          if (!delta.content && !delta.reasoning_content) continue;
          reply += delta.content || "";
          reasoning += delta.reasoning_content || "";
          thinking.hidden = !reasoning;
          thought.textContent = reasoning;
          render(body, reply);
          out.dataset.chunks = String(Number(out.dataset.chunks) + 1);
          scrollDown();
        }
      }
    }
    out.dataset.state = "done";
  } catch (e) {
    if (controller.signal.aborted) {
      out.dataset.state = "stopped";
    } else {
      out.dataset.state = "error";
      out.classList.add("error");
      body.append(reply ? "\n" : "", `error: ${e.message}`);
    }
  }
  if (at === chat && reply) turns.push({ role: "assistant", content: reply });
  else if (at === chat) turns.pop(); // nothing came: the message can be sent again
  if (running === controller) setRunning(null);
  pollStatus();
}

const bytes = (n) => (n >= 1e9 ? `${(n / 1e9).toFixed(2)} GB` : `${(n / 1e6).toFixed(0)} MB`);
const rate = (x) => (x > 0 ? `${x.toFixed(1)} tok/s` : "–");

function showStatus(s) {
  model = s.model;
  const r = s.requests;
  const fields = {
    "s-model": s.model,
    "s-device": `${s.device}, ${s.parallel} sequences at once`,
    "s-memory": `${bytes(s.memory.resident_bytes)} resident, ${bytes(s.memory.weights_bytes)} of weights`,
    "s-kv": `${s.memory.kv_cache_tokens} tokens (${s.kv_type}), ${bytes(s.memory.kv_cache_bytes)}`,
    "s-resident": `${s.resident.conversations}, ${s.resident.tokens} tokens cached`,
    "s-requests": `${r.total}: ${r.active} running, ${r.queued} queued, ${r.cancelled} cancelled, ${r.failed} failed`,
    "s-prefill": `${rate(s.tok_s.prefill)} (${s.tokens.prompt} prompt tokens, ${s.tokens.cached} of them cached)`,
    "s-decode": `${rate(s.tok_s.decode)} (${s.tokens.generated} tokens generated)`,
    "s-kflash": s.kflash ? `${s.kflash.tokens_per_pass.toFixed(2)} tokens a pass (${s.kflash.passes} passes)` : "off",
  };
  for (const [id, text] of Object.entries(fields)) $(id).textContent = text;
  document.body.dataset.status = "ok";
}

async function pollStatus() {
  try {
    const res = await fetch("/status", { headers: apiHeaders() });
    if (!res.ok) {
      const message = await errorOf(res);
      return res.status === 401 ? needKey(message) : showError(message);
    }
    showStatus(await res.json());
    showError("");
  } catch (e) {
    showError(`the server does not answer (${e.message})`);
  }
}

$("compose").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || running) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("compose").requestSubmit();
  }
});
$("stop").addEventListener("click", () => running && running.abort());
$("reset").addEventListener("click", () => {
  if (running) running.abort();
  chat++;
  turns.length = 0;
  $("messages").replaceChildren();
});
$("key").addEventListener("change", () => {
  localStorage.setItem("kapitsa-key", $("key").value);
  pollStatus();
});
$("key").value = localStorage.getItem("kapitsa-key") || "";
pollStatus();
setInterval(pollStatus, 2000);
