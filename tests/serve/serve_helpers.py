"""Start a real `sluice serve` process on 127.0.0.1 (a free port) and stop it."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SLUICE = str(Path(sys.executable).parent / "sluice")
START_TIMEOUT_S = 120


@dataclass
class ServeProcess:
    url: str
    api_key: str | None
    process: subprocess.Popen

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def stop(self) -> str:
        """Ctrl+C, as a user stops it; returns what it wrote on stderr."""
        import signal
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.stderr.read()


def start_server(model_dir, *args, api_key: str | None = None) -> ServeProcess:
    cmd = [SLUICE, "serve", str(model_dir), "--port", "0", *map(str, args)]
    if api_key:
        cmd += ["--api-key", api_key]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8")
    deadline = time.monotonic() + START_TIMEOUT_S
    line = process.stdout.readline()            # the one line it prints once it listens
    if not line or time.monotonic() > deadline:
        process.kill()
        raise RuntimeError(f"sluice serve did not start: {process.stderr.read()}")
    url = re.search(r"http://[0-9.]+:\d+", line).group(0)
    return ServeProcess(url, api_key, process)
