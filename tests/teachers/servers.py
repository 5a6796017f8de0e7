"""A real `distill serve-teacher` in a subprocess, the same app in-process (fast, for request-level tests),
and a fault-injecting proxy in front of either."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from distill.commands.serve_teacher import wait_until_healthy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_teacher(model_dir, *extra: str):
    """Start `distill serve-teacher model_dir` on a free loopback port; yields (url, process)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "distill", "serve-teacher", str(model_dir), "--port", str(port),
                                "--device", "cpu", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        try:
            wait_until_healthy(f"http://127.0.0.1:{port}", 120.0, process)
        except RuntimeError as error:
            raise RuntimeError(f"{error}: {process.stderr.read().decode()[-2000:]}") from None
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.kill()
        process.wait()


@contextlib.contextmanager
def serve_app(app):
    """Run an ASGI app (`distill.serving.app.build_app(...)`) with uvicorn on a thread, on a free loopback port; yields its URL.

    Starts in well under a second (no model load in a subprocess), so each hostile request is cheap to test.
    """
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        wait_until_healthy(url, 30.0)
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def post(url: str, path: str, body, headers: dict | None = None) -> tuple[int, object]:
    """POST `body` (bytes as they are, an iterable of bytes sent chunked, anything else as JSON) -> (status, decoded answer)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    chunked = not isinstance(body, (bytes, str, dict, list, int, float, type(None))) and hasattr(body, "__iter__")
    data = body if isinstance(body, bytes) or chunked else json.dumps(body).encode()
    connection.request("POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})},
                       encode_chunked=chunked)
    response = connection.getresponse()
    raw = response.read()
    connection.close()
    return response.status, json.loads(raw) if raw else None


class FaultProxy:
    """Forwards to `upstream`; each POST /v1/completions takes the next fault from `faults` (then 'ok').

    Faults: 'ok', 'garbage' (not JSON), '500', 'slow' (answers after `delay` s), 'short' (one prompt_logprobs
    entry missing), 'bad_id' (an id outside the vocabulary), 'drop' (closes the connection).
    """

    def __init__(self, upstream: str, faults: list[str], delay: float = 3.0, ignore_temperature: bool = False):
        self.upstream = upstream.removeprefix("http://")
        self.faults, self.delay, self.seen = list(faults), delay, []
        self.ignore_temperature = ignore_temperature  # behave like stock vLLM: prompt log-probs at temperature 1
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self, method: str, body: bytes | None) -> tuple[int, bytes]:
                host, port = proxy.upstream.split(":")
                connection = http.client.HTTPConnection(host, int(port), timeout=60)
                connection.request(method, self.path, body=body, headers={"Content-Type": "application/json"} if body else {})
                response = connection.getresponse()
                return response.status, response.read()

            def _answer(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer(*self._forward("GET", None))

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/completions":
                    self._answer(*self._forward("POST", body))
                    return
                if proxy.ignore_temperature:
                    request = json.loads(body)
                    request.pop("prompt_logprobs_temperature", None)
                    body = json.dumps(request).encode()
                fault = proxy.faults.pop(0) if proxy.faults else "ok"
                proxy.seen.append(fault)
                if fault == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault == "500":
                    self._answer(500, b'{"error": "boom"}')
                    return
                if fault == "garbage":
                    self._answer(200, b"<html>not json")
                    return
                if fault == "slow":
                    time.sleep(proxy.delay)
                status, data = self._forward("POST", body)
                if fault in ("short", "bad_id"):
                    answer = json.loads(data)
                    if fault == "short":
                        answer["choices"][0]["prompt_logprobs"].pop()
                    else:
                        entry = answer["choices"][0]["prompt_logprobs"][-1]
                        entry["99999999"] = next(iter(entry.values()))
                    data = json.dumps(answer).encode()
                self._answer(status, data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FaultProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
