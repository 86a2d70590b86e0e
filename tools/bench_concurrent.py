#!/usr/bin/env python3
"""Decode throughput of the server with several requests at once, KFlash on
(--draft) against off, side by side in one run, on the default model pair.

Each of S clients sends the same greedy raw completion (a bench task: by default
the edit task, whose answer repeats its prompt) at the same moment, twice (the
first round warms the tuner); the figure is the second round's generated tokens
over its wall time until the last request finishes.
The answers must be identical with and without the draft (greedy decoding).

usage: tools/bench_concurrent.py [--task edit|complete] [--gen 200] [--seqs 1,2,4] [--runs 3]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import threading
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def serve(extra):
    port = random.randint(20000, 40000)
    proc = subprocess.Popen([f"{ROOT}/build/kapitsa", "serve", "--port", str(port), "--parallel", "4", *extra],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{base}/health", timeout=1)
            return proc, base
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start")


def post(base, body):
    req = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))


def run(base, prompt, gen, seqs):
    body = {"model": "m", "prompt": prompt, "max_tokens": gen, "temperature": 0}
    post(base, {**body, "max_tokens": 1})  # the prompt resident, as for an agent's next turn
    rounds(base, body, seqs)  # KFlash's tuner warm, as in a server that has been running
    return rounds(base, body, seqs)


def rounds(base, body, seqs):
    out = [None] * seqs
    go = threading.Barrier(seqs)

    def client(i):
        go.wait()
        out[i] = post(base, body)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(seqs)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    texts = [r["choices"][0]["text"] for r in out]
    return sum(r["usage"]["completion_tokens"] for r in out) / wall, texts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="edit")
    ap.add_argument("--gen", type=int, default=200)
    ap.add_argument("--seqs", default="1,2,4")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    prompt = open(f"{ROOT}/tools/bench_tasks/{a.task}.txt").read()
    modes = {"plain": [], "kflash": ["--draft", f"{ROOT}/models/kapitsa-tiny-draft"]}
    for seqs in [int(s) for s in a.seqs.split(",")]:
        rates = {m: [] for m in modes}
        answers = {}
        for _ in range(a.runs):
            for m, extra in modes.items():
                proc, base = serve(extra)
                try:
                    rate, texts = run(base, prompt, a.gen, seqs)
                finally:
                    proc.terminate()
                    proc.wait()
                rates[m].append(rate)
                answers.setdefault(m, texts)
                assert all(t == texts[0] for t in texts), f"{m}: the {seqs} answers differ"
        same = answers["plain"] == answers["kflash"]
        p, k = statistics.median(rates["plain"]), statistics.median(rates["kflash"])
        print(f"{seqs} at once: plain {p:.1f} tok/s, KFlash {k:.1f} tok/s (runs: "
              f"{', '.join(f'{r:.1f}' for r in rates['kflash'])}), {k / p:.2f}x; answers identical: {same}")


if __name__ == "__main__":
    main()
