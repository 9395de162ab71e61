"""The health probe against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tfrecordd.cli.health import check, main_healthcheck


class _Handler(BaseHTTPRequestHandler):
    """``/healthz`` answers with the server's ``status``; ``/slow`` too, once released."""

    server: _Server

    def do_GET(self) -> None:
        if self.path == "/slow":
            self.server.release.wait(5)
        if self.path == "/healthz" or self.path == "/slow":
            code, body = self.server.status, b"ok\n" if self.server.status == 200 else b"stalled\n"
        else:
            code, body = 404, b"not found\n"
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    status = 200
    release = threading.Event()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up (the timeout test) closes before the answer


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.release = threading.Event()
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.release.set()
        srv.shutdown()
        srv.server_close()
        thread.join()


def _url(srv: _Server, path: str = "/healthz") -> str:
    host, port = srv.server_address[:2]
    return f"http://{host!s}:{port}{path}"


def test_200_is_healthy(server: _Server) -> None:
    healthy, reason = check(_url(server))
    assert healthy
    assert "200" in reason
    assert "ok" in reason


def test_503_is_unhealthy_with_the_body_as_reason(server: _Server) -> None:
    server.status = 503
    healthy, reason = check(_url(server))
    assert not healthy
    assert "503" in reason
    assert "stalled" in reason


def test_other_success_codes_are_not_healthy(server: _Server) -> None:
    server.status = 204
    healthy, reason = check(_url(server))
    assert not healthy
    assert "204" in reason


def test_unknown_path_is_unhealthy(server: _Server) -> None:
    healthy, reason = check(_url(server, "/nothing"))
    assert not healthy
    assert "404" in reason


def test_connection_refused_is_unhealthy() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The port was just free and nothing listens on it now.
    healthy, reason = check(f"http://127.0.0.1:{port}/healthz", timeout=2)
    assert not healthy
    assert "refused" in reason.lower()


def test_slow_answer_times_out(server: _Server) -> None:
    started = time.monotonic()
    healthy, reason = check(_url(server, "/slow"), timeout=0.3)
    assert not healthy
    assert "timed out" in reason.lower()
    assert time.monotonic() - started < 1.5


def test_proxy_from_environment_is_ignored(
    server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert check(_url(server))[0]


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/healthz", "127.0.0.1"])
def test_non_http_url_is_refused(url: str) -> None:
    healthy, reason = check(url)
    assert not healthy
    assert "not an http(s) URL" in reason


def test_main_exit_codes_and_output(server: _Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_healthcheck(_url(server)) == 0
    out, err = capsys.readouterr()
    assert "200" in out
    assert err == ""

    server.status = 503
    assert main_healthcheck(_url(server)) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "503" in err
