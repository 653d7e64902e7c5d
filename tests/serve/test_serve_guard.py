"""Who may talk to a server: a real engine behind a real server on 127.0.0.1, asked with httpx and raw sockets.

Browser pages are kept out (a DNS-rebinding Host, a cross-site simple POST with a foreign Origin), bodies are
JSON only, half-open connections neither lock real clients out nor fill the log, and a huge stop string
neither holds the engine nor outlives its client."""
import logging
import socket
import time

import httpx
import pytest

import engine
from engine.errors import SluiceError
from engine.serve import Server
from engine.serve import connections

HI = [{"role": "user", "content": "hello world"}]
CHAT = {"messages": HI, "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def loaded(serve_model):
    eng = engine.load(serve_model, max_context=384)
    yield eng
    eng.close()


@pytest.fixture
def serve(loaded):
    """serve(**Server options) -> a started server; all stopped at the end."""
    started = []

    def start(**options):
        server = Server(loaded, port=0, **options)
        server.start()
        started.append(server)
        return server
    yield start
    for server in started:
        server.stop()


def served(server) -> int:
    return httpx.get(server.url + "/metrics").json()["server"]["served"]


def test_a_foreign_host_name_is_refused_and_allowed_ones_answer(serve):
    server = serve()
    refused = httpx.post(server.url + "/v1/chat/completions", json=CHAT, headers={"Host": "rebind.attacker.example"})
    assert refused.status_code == 403 and "--allowed-hosts" in refused.json()["error"]["message"]
    assert httpx.get(server.url + "/api/tags", headers={"Host": "evil.example:80"}).json()["error"].endswith(".")
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", "localhost"):
        assert httpx.post(server.url + "/v1/chat/completions", json=CHAT, headers={"Host": host}).status_code == 200
    assert served(server) == 3
    named = serve(allowed_hosts=["my.box"])
    assert httpx.get(named.url + "/v1/models", headers={"Host": f"my.box:{named.port}"}).status_code == 200
    assert httpx.get(named.url + "/v1/models", headers={"Host": "other.box"}).status_code == 403


@pytest.mark.parametrize("content_type,content", [
    ("text/plain", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'),
    ("application/x-www-form-urlencoded", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'),
    ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n{}\r\n--x--\r\n'),
])
def test_bodies_that_are_not_json_start_nothing(serve, content_type, content):
    server = serve()
    for path in ("/v1/chat/completions", "/api/chat"):
        response = httpx.post(server.url + path, content=content, headers={"Content-Type": content_type})
        assert response.status_code == 415, response.text
        assert "Content-Type: application/json" in str(response.json()["error"])
    assert served(server) == 0
    charset = httpx.post(server.url + "/v1/chat/completions", content=b'{"messages": [{"role": "user", '
                         b'"content": "hi"}], "max_tokens": 2}', headers={"Content-Type": "application/json; charset=utf-8"})
    assert charset.status_code == 200


def test_browser_origins_are_refused_unless_allowed(serve):
    server = serve()
    page = {"Origin": "https://any.site.example"}
    response = httpx.post(server.url + "/v1/chat/completions", json=CHAT, headers=page)
    assert response.status_code == 403 and "--allowed-origins" in response.json()["error"]["message"]
    assert httpx.get(server.url + "/v1/models", headers=page).status_code == 403
    assert served(server) == 0

    key = "sk-test"
    allowed = serve(allowed_origins=["http://localhost:3000"], api_key=key)
    ui = {"Origin": "http://localhost:3000"}
    preflight = httpx.options(allowed.url + "/v1/chat/completions", headers={
        **ui, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    answer = httpx.post(allowed.url + "/v1/chat/completions", json=CHAT,
                        headers={**ui, "Authorization": f"Bearer {key}"})
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert httpx.post(allowed.url + "/v1/chat/completions", json=CHAT, headers=ui).status_code == 401
    assert httpx.post(allowed.url + "/v1/chat/completions", json=CHAT,
                      headers={"Origin": "http://localhost:3001", "Authorization": f"Bearer {key}"}).status_code == 403


def _half_open(server, count: int) -> list[socket.socket]:
    """Connections that send the start of a request head and then nothing."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(sock)
    return socks


def _is_closed(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def test_half_open_connections_neither_lock_clients_out_nor_stay(serve, monkeypatch):
    monkeypatch.setattr(connections, "HEADER_TIMEOUT_S", 1.0)
    server = serve()
    socks = _half_open(server, connections.MAX_CONNECTIONS + 200)
    try:
        started = time.monotonic()
        answer = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert answer.status_code == 200 and time.monotonic() - started < 5
        assert _is_closed(socks[0], 0.5)                     # the longest-waiting were closed to make room
        assert _is_closed(socks[-1], 3.0)                    # the rest once their head was 1 s late
    finally:
        for sock in socks:
            sock.close()


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))


def test_a_burst_of_bad_requests_logs_one_line(serve):
    server = serve()
    records = Records()
    logger = logging.getLogger("uvicorn.error")          # where uvicorn reports each malformed request
    logger.addHandler(records)
    try:
        for _ in range(100):
            with socket.create_connection(("127.0.0.1", server.port)) as sock:
                sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                sock.settimeout(5)
                assert sock.recv(100).startswith(b"HTTP/1.1 400")
    finally:
        logger.removeHandler(records)
    assert len(records.lines) == 1 and "Traceback" not in records.lines[0], records.lines


def test_a_slow_body_is_dropped_with_408(serve, monkeypatch):
    from engine.serve import guard
    monkeypatch.setattr(guard, "BODY_IDLE_TIMEOUT_S", 0.5)
    server = serve()
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"messages\"")
        sock.settimeout(5)
        assert sock.recv(200).startswith(b"HTTP/1.1 408")
    finally:
        sock.close()


def test_a_huge_stop_string_neither_holds_the_engine_nor_outlives_its_client(serve):
    server = serve()
    body = {"messages": HI, "max_tokens": 360, "temperature": 0, "stop": ["ab" * 1_500_000]}     # 3 M characters
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=1.0)
    started = time.monotonic()
    answer = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=60).json()
    assert answer["usage"]["completion_tokens"] == 2 and time.monotonic() - started < 5


@pytest.mark.parametrize("options,words", [
    ({"port": 99999}, "--port"), ({"port": -1}, "--port"), ({"max_waiting": 0}, "--max-queue"),
    ({"api_key": "clé-secrète"}, "ASCII"), ({"api_key": "two words"}, "ASCII"),
])
def test_settings_a_server_cannot_work_with_are_one_sentence(loaded, options, words):
    with pytest.raises(SluiceError, match=words):
        Server(loaded, **{"port": 0, **options})
