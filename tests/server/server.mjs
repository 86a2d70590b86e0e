// Starting and stopping `kapitsa serve` for the SDK tests.
import { spawn } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";

export const ROOT = new URL("../..", import.meta.url).pathname;
const BIN = process.env.KAPITSA_BIN || `${ROOT}/build/kapitsa`; // the ASan build works too
// KAPITSA_SERVE_ARGS: extra serve flags for every server (tests/run.sh runs the suite once with KFlash on)
const EXTRA = (process.env.KAPITSA_SERVE_ARGS || "").split(" ").filter(Boolean);
const procs = [];

// A free port is a guess: below Linux's ephemeral range (32768 up), where
// outgoing connections take theirs, and guessed again if another process holds it.
export async function startServer(extra = []) {
  for (let attempt = 1; ; attempt++) {
    const srv = await startOn(20000 + Math.floor(Math.random() * 12000), extra);
    if (srv.base) return srv;
    if (attempt === 5 || !srv.log.includes("cannot listen")) throw new Error(srv.error + srv.log);
  }
}

async function startOn(port, extra) {
  const proc = spawn(BIN, ["serve", "--port", String(port), "--ctx", "4096", ...(extra.includes("--parallel") ? [] : ["--parallel", "4"]), ...EXTRA, ...extra], {
    cwd: ROOT,
    stdio: ["ignore", "inherit", "pipe"],
  });
  let log = "";
  proc.stderr.on("data", (d) => {
    log += d;
    if (process.env.KAPITSA_SERVER_LOG) process.stderr.write(d);
  });
  procs.push(proc);
  let exited = false;
  proc.on("exit", () => (exited = true));
  const base = `http://127.0.0.1:${port}`;
  // Sanitizer builds start slowly (TSan beside another TSan server took 7.6 s on
  // the dev VM, past 10 s on CI): wait while the process lives, give up when it exits.
  for (let i = 0; i < 1200 && !exited; i++) {
    try {
      if ((await fetch(`${base}/health`)).ok) return { base, proc, log: () => log };
    } catch {}
    await sleep(100);
  }
  return { error: exited ? "server exited: " : "server did not start in 120 s: ", log };
}

export function stopServers() {
  procs.forEach((p) => p.kill("SIGTERM"));
}
