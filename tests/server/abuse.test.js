// The server under abuse: slow and idle connections from one address do not
// lock others out.
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
