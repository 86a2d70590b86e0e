// The server under abuse: slow and idle connections from one address do not
// lock others out; a request without the key is refused before its body is
// taken; a body of countless tiny JSON values is refused before it is parsed.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { startServer, stopServers } from "./server.mjs";

after(stopServers);

test("100 connections from one address trickling their headers: the address is capped, /health and a request still answer", async () => {
  const s = await startServer();
  const port = Number(new URL(s.base).port);
  // another loopback address, as an attacker elsewhere would be (the server listens on 127.0.0.1)
  let closed = 0;
  const socks = [];
  for (let i = 0; i < 100; i++) {
    const sock = net.connect({ port, host: "127.0.0.1", localAddress: "127.0.0.2" });
    sock.on("error", () => {});
    sock.on("close", () => closed++);
    sock.write("GET /health HTTP/1.1\r\nHo");
    socks.push(sock);
  }
  const trickle = setInterval(() => socks.forEach((k) => k.destroyed || k.write("x")), 1000);
  try {
    // past the per-address cap of 64 the server closes them at once
    for (let i = 0; i < 400 && closed < 36; i++) await new Promise((r) => setTimeout(r, 25));
    assert.ok(closed >= 36 && closed < 100, `${closed} of 100 closed`);
    const h = await fetch(`${s.base}/health`);
    assert.equal(h.status, 200);
    const r = await fetch(`${s.base}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 3 }),
    });
    assert.equal(r.status, 200);
    assert.equal((await r.json()).choices.length, 1);
  } finally {
    clearInterval(trickle);
    socks.forEach((k) => k.destroy());
  }
  s.proc.kill("SIGTERM");
});

test("with --api-key a 32 MiB upload without the key gets its 401 before the body is sent", async () => {
  const s = await startServer(["--api-key", "s3cret"]);
  const port = Number(new URL(s.base).port);
  const sock = net.connect({ port, host: "127.0.0.1" });
  let got = "";
  const answered = new Promise((resolve) => {
    sock.on("data", (d) => {
      got += d;
      if (got.includes("\r\n\r\n")) resolve(got);
    });
    sock.on("close", () => resolve(got));
    sock.on("error", () => resolve(got));
  });
  // the headers and the first 64 KiB of the body; the rest never comes
  sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${32 << 20}\r\n\r\n`);
  sock.write('{"messages":[{"role":"user","content":"' + "a".repeat(65536));
  const late = new Promise((resolve) => setTimeout(() => resolve("no answer in 60 s"), 60000).unref());
  const head = await Promise.race([answered, late]);
  sock.destroy();
  assert.match(head, /^HTTP\/1\.1 401/, head.slice(0, 200));
  const ok = await fetch(`${s.base}/v1/models`, { headers: { authorization: "Bearer s3cret" } });
  assert.equal(ok.status, 200);
  s.proc.kill("SIGTERM");
});

test("a body of 600,000 tiny JSON values is refused with 413 in the API's shape; strings count as one", async () => {
  const s = await startServer();
  const post = (url, body) => fetch(`${s.base}${url}`, { method: "POST", headers: { "content-type": "application/json" }, body });
  const many = '{"messages":[' + Array(600000).fill("1").join(",") + "]}";
  let r = await post("/v1/chat/completions", many);
  assert.equal(r.status, 413);
  let e = await r.json();
  assert.equal(e.error.type, "invalid_request_error");
  assert.match(e.error.message, /JSON values/);
  r = await post("/v1/messages", many);
  assert.equal(r.status, 413);
  e = await r.json();
  assert.equal(e.type, "error");
  // commas and brackets inside a string are text, not values
  r = await post("/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "[1,".repeat(600000) }], max_tokens: 1 }));
  assert.notEqual(r.status, 413);
  s.proc.kill("SIGTERM");
});
