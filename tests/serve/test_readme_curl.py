"""README's curl examples, run as written (the address aside: a free port) against a real `sluice serve`."""
import json
import re
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from serve_helpers import start_server

README = Path(__file__).resolve().parents[2] / "README.md"
README_ADDRESS = "http://127.0.0.1:8000"         # `sluice serve`'s default, and the app's Local server's
KEY = "sk-readme"


def readme_curls() -> list[str]:
    return re.findall(r"`(curl [^`]+)`", README.read_text())


def answer_of(command: str, url: str) -> dict:
    """The last NDJSON line curl prints for `command` from README, sent to url."""
    argv = shlex.split(command.replace(README_ADDRESS, url).replace("YOUR-KEY", KEY))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_curl_examples_chat_with_and_without_a_key(serve_model):
    plain, keyed = readme_curls()
    assert plain.startswith(f"curl {README_ADDRESS}/api/chat") and "Bearer YOUR-KEY" in keyed
    with ThreadPoolExecutor(2) as pool:          # both servers start at once (each mostly imports, on one core)
        starts = [pool.submit(start_server, serve_model, api_key=api_key) for api_key in (None, KEY)]
    servers = [start.result() for start in starts if start.exception() is None]
    try:
        assert len(servers) == 2, [start.exception() for start in starts]
        for command, server in zip((plain, keyed), servers):
            answer = answer_of(command, server.url)
            assert answer["done"] is True and 0 < answer["eval_count"] <= 64, answer      # the example's cap
            if server.api_key:                                           # the header is what lets it in
                assert "API key is missing" in answer_of(plain, server.url)["error"]
    finally:
        for server in servers:
            server.stop()
