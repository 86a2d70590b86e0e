// Starting and stopping `kapitsa serve` for the SDK tests.
import { spawn } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";

export const ROOT = new URL("../..", import.meta.url).pathname;
const BIN = process.env.KAPITSA_BIN || `${ROOT}/build/kapitsa`; // the ASan build works too
// KAPITSA_SERVE_ARGS: extra serve flags for every server (tests/run.sh runs the suite once with KFlash on)
const EXTRA = (process.env.KAPITSA_SERVE_ARGS || "").split(" ").filter(Boolean);
const procs = [];

// The server takes a free port itself (--port 0) and names it in its banner:
// a port guessed here could be one an earlier server of the suite still holds,
// whose /health would answer for the new one.
export async function startServer(extra = []) {
  const proc = spawn(BIN, ["serve", "--port", "0", "--ctx", "4096", ...(extra.includes("--parallel") ? [] : ["--parallel", "4"]), ...EXTRA, ...extra], {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "", out = "";
  proc.stdout.on("data", (d) => (out += d));
  proc.stderr.on("data", (d) => {
    log += d;
    if (process.env.KAPITSA_SERVER_LOG) process.stderr.write(d);
  });
  procs.push(proc);
  let exited = false;
  proc.on("exit", () => (exited = true));
  // Sanitizer builds start slowly (TSan beside another TSan server took 7.6 s on
  // the dev VM, past 10 s on CI): wait while the process lives, give up when it exits.
  for (let i = 0; i < 1200 && !exited; i++) {
    const m = log.match(/^kapitsa: serving .* on (http:\/\/127\.0\.0\.1:\d+)$/m);
    if (m) {
      try {
        if ((await fetch(`${m[1]}/health`)).ok) return { base: m[1], proc, log: () => log, out: () => out };
      } catch {}
    }
    await sleep(100);
  }
  throw new Error((exited ? "server exited: " : "server did not start in 120 s: ") + log);
}

export function stopServers() {
  procs.forEach((p) => p.kill("SIGTERM"));
}
