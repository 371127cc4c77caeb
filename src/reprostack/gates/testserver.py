"""A small OpenAI-compatible streaming server for testing the serving gates on a CPU (stdlib only).

`python -m reprostack.gates.testserver --port 0 --port-file F` serves, on 127.0.0.1:
- GET /v1/models, GET /health (readiness; answer 503 until `--ready-after-s` has passed);
- POST /v1/completions and /v1/chat/completions, streamed as Server-Sent Events when `stream` is true, one
  token (the word `tok`) per chunk every `--token-interval-s` seconds, `max_tokens` / `max_completion_tokens`
  tokens (ignore_eos is implied: the server never stops early), with a final `usage` chunk when
  `stream_options.include_usage` is set, then `data: [DONE]`; non-streamed requests get one JSON body.

Faults, for the gate's FAIL and ERROR paths (request numbers count generation requests from 1):
- `--fail-every N`: every Nth request is answered HTTP 500 with an OpenAI error body;
- `--stall-at N`: request N stops after its first token and never finishes (the client must time out);
- `--die-after N`: the process exits (code 70, no reply) when request N arrives;
- `--load LIB` (repeatable): the shared library is mapped at start-up (ctypes), as an engine maps its NCCL, so the
  gate's one-NCCL check of the server's processes has something to read;
- `--log-line TEXT` (repeatable): printed to stdout at start-up, before serving (used to stand in for an
  engine's start-up log in the local-test profile; these lines prove nothing about DeepEP); a line holding
  `{rank}` is printed once per rank 0..`--ranks`-1 (`{ranks}` becomes the count).

Timing is deterministic in count (exact token counts) and paced by sleep (so throughput is about
concurrency / token interval tokens/s, minus HTTP overhead).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DIE_EXIT_CODE = 70


class _State:
    def __init__(self, args):
        self.args = args
        self.count = 0
        self.lock = threading.Lock()
        self.started = time.monotonic()

    def next_request(self) -> int:
        with self.lock:
            self.count += 1
            return self.count


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: _State  # set on the subclass made by serve()

    def log_message(self, fmt, *a):  # one line per request on stderr, like an engine's access log
        if self.state.args.access_log:
            sys.stderr.write("%s - %s\n" % (self.address_string(), fmt % a))

    def _json(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server API)
        a = self.state.args
        ready = time.monotonic() - self.state.started >= a.ready_after_s
        if self.path.rstrip("/") == "/v1/models":
            if not ready:
                return self._json(503, {"error": {"message": "model loading", "type": "unavailable", "code": 503}})
            return self._json(200, {"object": "list", "data": [{"id": a.model, "object": "model", "owned_by": "test"}]})
        if self.path.rstrip("/") == "/health":
            return self._json(200 if ready else 503, {"status": "ok" if ready else "loading"})
        return self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found", "code": 404}})

    def do_POST(self):  # noqa: N802
        """A generation request: the faults asked for (--die-after, --fail-every), then the reply, whole or streamed."""
        a = self.state.args
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found", "code": 404}})
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            return self._json(400, {"error": {"message": "body is not JSON", "type": "invalid_request", "code": 400}})
        n = self.state.next_request()
        if a.die_after and n >= a.die_after:
            sys.stderr.write(f"testserver: dying at request {n} (--die-after {a.die_after})\n")
            sys.stderr.flush()
            os._exit(DIE_EXIT_CODE)
        if a.fail_every and n % a.fail_every == 0:
            return self._json(
                500, {"error": {"message": f"injected failure on request {n}", "type": "server_error", "code": 500}}
            )
        chat = self.path.endswith("chat/completions")
        max_tokens = int(req.get("max_completion_tokens") or req.get("max_tokens") or a.default_max_tokens)
        prompt = (
            req.get("prompt")
            if not chat
            else " ".join(str(m.get("content", "")) for m in req.get("messages", []) if isinstance(m, dict))
        )
        prompt_tokens = len(str(prompt or "").split())
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        }
        if not req.get("stream"):
            return self._whole(n, chat, max_tokens, usage)
        return self._stream(n, chat, max_tokens, usage, req.get("stream_options"))

    def _whole(self, n: int, chat: bool, max_tokens: int, usage: dict) -> None:
        """A non-streamed reply: one JSON body after the time its tokens take."""
        a = self.state.args
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": f"cmpl-{n}", "object": kind, "created": int(time.time()), "model": a.model}
        time.sleep(a.token_interval_s * max_tokens)
        text = " ".join(["tok"] * max_tokens)
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        self._json(200, {**head, "choices": [choice], "usage": usage})

    def _stream(self, n: int, chat: bool, max_tokens: int, usage: dict, options) -> None:
        """A streamed reply (Server-Sent Events): one token per chunk every --token-interval-s (request --stall-at
        stops after its first), the `usage` chunk when the request's `stream_options` (`options`) ask for it, then
        `[DONE]`."""
        a = self.state.args
        rid, created = f"cmpl-{n}", int(time.time())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def send(obj) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        kind_chunk = "chat.completion.chunk" if chat else "text_completion"
        try:
            for i in range(max_tokens):
                time.sleep(a.token_interval_s)
                piece = "tok" if i == 0 else " tok"
                last = i == max_tokens - 1
                choice = (
                    {
                        "index": 0,
                        "delta": {"content": piece, **({"role": "assistant"} if i == 0 else {})},
                        "finish_reason": "length" if last else None,
                    }
                    if chat
                    else {"index": 0, "text": piece, "finish_reason": "length" if last else None}
                )
                send({"id": rid, "object": kind_chunk, "created": created, "model": a.model, "choices": [choice]})
                if a.stall_at and n == a.stall_at:
                    sys.stderr.write(f"testserver: stalling request {n} (--stall-at)\n")
                    sys.stderr.flush()
                    time.sleep(3600)
            if (options or {}).get("include_usage"):
                send(
                    {
                        "id": rid,
                        "object": kind_chunk,
                        "created": created,
                        "model": a.model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            send("[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            pass


def parser() -> argparse.ArgumentParser:
    """The command line (see the module doc)."""
    p = argparse.ArgumentParser(prog="python -m reprostack.gates.testserver", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (see --port-file)")
    p.add_argument("--port-file", default=None, help="write the bound port here once listening")
    p.add_argument("--model", default="test-model")
    p.add_argument("--token-interval-s", type=float, default=0.005)
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--ready-after-s", type=float, default=0.0)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--stall-at", type=int, default=0)
    p.add_argument("--die-after", type=int, default=0)
    p.add_argument("--log-line", action="append", default=[])
    p.add_argument("--ranks", type=int, default=1, help="a --log-line holding {rank} is printed once per rank")
    p.add_argument("--access-log", action="store_true")
    p.add_argument(
        "--load",
        action="append",
        default=[],
        help="a shared library to map at start-up (ctypes), as an engine maps its NCCL: the gate reads the maps",
    )
    return p


def serve(args) -> None:
    """Map --load's libraries, bind, print the start-up lines, write --port-file, serve until killed."""
    import ctypes

    loaded = [ctypes.CDLL(lib) for lib in args.load]  # kept mapped while it serves  # noqa: F841
    handler = type("BoundHandler", (Handler,), {"state": _State(args)})
    httpd = ThreadingHTTPServer((args.host, args.port), handler)
    httpd.daemon_threads = True
    for line in args.log_line:
        per_rank = "{rank}" in line
        for r in range(args.ranks if per_rank else 1):
            print(line.replace("{rank}", str(r)).replace("{ranks}", str(args.ranks)), flush=True)
    port = httpd.server_address[1]
    print(f"testserver: listening on http://{args.host}:{port} model {args.model}", flush=True)
    if args.port_file:
        tmp = Path(args.port_file).with_suffix(".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, args.port_file)
    httpd.serve_forever()


if __name__ == "__main__":
    serve(parser().parse_args())
