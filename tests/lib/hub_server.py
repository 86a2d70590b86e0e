#!/usr/bin/env python3
"""A Hugging Face hub for the pull tests: the model info API, resolve/ with a
redirect to a second path for LFS files, Range requests, ETags and the
X-Linked-* / X-Repo-Commit headers, and faults: kapitsa/flaky drops the
connection halfway through the first download of each LFS file,
kapitsa/corrupt serves a flipped byte, kapitsa/gated wants a token,
kapitsa/oversize lists config.json at 16 bytes and serves 4 MiB,
kapitsa/oddnames adds names to escape (a space and '#', a control character)
and names that leave the snapshot folder, kapitsa/llama's config.json names an
architecture Kapitsa does not run (model_type llama); with
GGUF_DIR, kapitsa/tiny-GGUF serves its files (folders included), as a GGUF repo.

usage: hub_server.py MODEL_DIR PORT_FILE LOG_FILE [GGUF_DIR]
Serves MODEL_DIR's files as each repo; writes its port to PORT_FILE and one line
per blob request ("REPO FILE RANGE") to LOG_FILE."""
import hashlib
import http.server
import json
import os
import urllib.parse
import sys
import threading

model_dir, port_file, log_file = sys.argv[1:4]
gguf_dir = sys.argv[4] if len(sys.argv) > 4 else None
REPOS = ["kapitsa/tiny", "kapitsa/flaky", "kapitsa/corrupt", "kapitsa/gated", "kapitsa/oversize", "kapitsa/oddnames",
         "kapitsa/llama"] + (["kapitsa/tiny-GGUF"] if gguf_dir else [])
TOKEN = "good-token"


def read_files(top):
    out = {}
    for root, _, names in os.walk(top):
        for n in sorted(names):
            name = os.path.relpath(os.path.join(root, n), top)
            data = open(os.path.join(root, n), "rb").read()
            out[name] = {
                "data": data,
                "lfs": name.endswith(".safetensors") or name.endswith(".gguf"),
                "sha256": hashlib.sha256(data).hexdigest(),
                "blob": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
            }
    return out


model_files = read_files(model_dir)
gguf_files = read_files(gguf_dir) if gguf_dir else {}


def blob_entry(data, lfs):
    return {"data": data, "lfs": lfs, "sha256": hashlib.sha256(data).hexdigest(),
            "blob": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}


odd_files = dict(model_files)
odd_files["a b#c.safetensors"] = blob_entry(b"odd", True)
odd_files["evil\x1b[2J.safetensors"] = blob_entry(b"evil", True)
ESCAPING = ["../../escape.json", "/abs.json", "sub/../../x.json"]
llama_files = dict(model_files)
llama_config = json.loads(model_files["config.json"]["data"])
llama_config.update(model_type="llama", architectures=["LlamaForCausalLM"])
llama_files["config.json"] = blob_entry(json.dumps(llama_config).encode(), False)


def files_of(repo):
    if repo == "kapitsa/oddnames":
        return odd_files
    if repo == "kapitsa/llama":
        return llama_files
    return gguf_files if repo == "kapitsa/tiny-GGUF" else model_files


commits = {r: hashlib.sha1(r.encode()).hexdigest() for r in REPOS}
dropped = set()
lock = threading.Lock()


class Hub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def fail(self, code, msg, error_code=None):
        body = json.dumps({"error": msg}).encode()
        self.send_response(code)
        if error_code:
            self.send_header("X-Error-Code", error_code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def repo_of(self, parts):
        repo = "/".join(parts[:2])
        if repo not in REPOS:
            self.fail(404, "Repository not found", "RepositoryNotFound")
            return None
        if repo == "kapitsa/gated" and self.headers.get("Authorization") != "Bearer " + TOKEN:
            self.fail(401, "Access to model kapitsa/gated is restricted.", "GatedRepo")
            return None
        return repo

    def do_GET(self):
        path = self.path.split("?")[0]
        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] == "revision":
            repo = self.repo_of(parts[2:4])
            if not repo:
                return
            if parts[5] not in ("main", commits[repo]):
                return self.fail(404, "Invalid rev id: " + parts[5], "RevisionNotFound")
            sib = []
            for name, f in files_of(repo).items():
                s = {"rfilename": name, "blobId": f["blob"], "size": len(f["data"])}
                if f["lfs"]:
                    s["lfs"] = {"sha256": f["sha256"], "size": len(f["data"]), "pointerSize": 134}
                if repo == "kapitsa/oversize" and name == "config.json":
                    s["size"] = 16
                sib.append(s)
            sib.append({"rfilename": "original/consolidated.pth", "blobId": "0" * 40, "size": 1})
            if repo == "kapitsa/oddnames":
                sib += [{"rfilename": n, "blobId": "1" * 40, "size": 2} for n in ESCAPING]
            body = json.dumps({"id": repo, "sha": commits[repo], "siblings": sib}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self.repo_of(parts[:2])
            if not repo:
                return
            name = "/".join(parts[4:])
            files = files_of(repo)
            if parts[3] not in ("main", commits[repo]) or name not in files:
                return self.fail(404, "Entry not found", "EntryNotFound")
            f = files[name]
            if f["lfs"]:
                self.send_response(302)
                self.send_header("Location", "/cdn/%s/%s" % (repo, urllib.parse.quote(name)))
                self.send_header("X-Linked-Etag", '"%s"' % f["sha256"])
                self.send_header("X-Linked-Size", str(len(f["data"])))
                self.send_header("X-Repo-Commit", commits[repo])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            return self.send_blob(repo, name, f, etag=f["blob"])
        if parts[0] == "cdn" and len(parts) >= 4:
            repo, name = "/".join(parts[1:3]), "/".join(parts[3:])
            if repo in REPOS and name in files_of(repo):
                f = files_of(repo)[name]
                return self.send_blob(repo, name, f, etag=f["sha256"])
        self.fail(404, "not found")

    def send_blob(self, repo, name, f, etag):
        data = f["data"]
        if repo == "kapitsa/oversize" and name == "config.json":
            data = data + b" " * (4 << 20)
        if repo == "kapitsa/corrupt" and f["lfs"]:
            data = bytearray(data)
            data[len(data) // 2] ^= 1
            data = bytes(data)
        rng = self.headers.get("Range", "")
        with open(log_file, "a") as log:
            log.write("%s %s %s\n" % (repo, name, rng or "-"))
        start = 0
        if rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
        body = data[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.send_header("ETag", '"%s"' % etag)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with lock:
            drop = repo == "kapitsa/flaky" and f["lfs"] and name not in dropped
            if drop:
                dropped.add(name)
        if drop:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body)


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # clients that stop reading (the full-disk test) are expected


srv = Server(("127.0.0.1", 0), Hub)
with open(port_file + ".tmp", "w") as pf:
    pf.write(str(srv.server_address[1]))
os.rename(port_file + ".tmp", port_file)
srv.serve_forever()
