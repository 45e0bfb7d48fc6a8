"""Run a `vllm serve` process on loopback for tests and demos: start, wait, query, always stop.

Why here: every serving test needs the same discipline (a free port on 127.0.0.1, a bounded wait
that fails fast when the server dies, bounded requests, and a stop that kills the whole process
group — vLLM forks an engine-core process — even when the test fails). Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maxtext_compat.errors import ServingError

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A started `vllm serve` process (its own process group) and where its log goes."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    model: str
    started_at: float = field(default_factory=time.monotonic)
    ready_after: float | None = None
    tmpdir: str | None = None  # the server's own $TMPDIR (vLLM's IPC sockets, `serve --tiny`'s model): removed at stop
    left_in_tmpdir: list[str] | None = None  # what its processes left there, read at stop before removing it

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------------ lifecycle

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds until /health answered 200; typed error (with the log tail) if the process died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServingError(
                    "vllm serve exited before it was ready",
                    argument="vllm serve",
                    expected="/health answering 200",
                    found=f"exit code {self.proc.returncode}; log tail:\n{self.log_tail()}",
                    fix=f"read {self.log_path}",
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_after = time.monotonic() - self.started_at
                        return self.ready_after
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise ServingError(
            "vllm serve did not become ready in time",
            argument="timeout",
            expected=f"ready within {timeout:.0f} s",
            found=f"log tail:\n{self.log_tail()}",
            fix=f"read {self.log_path}",
        )

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM the process group, then SIGKILL it; returns the exit code."""
        if self.alive():
            _signal_group(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        _signal_group(self.proc.pid, signal.SIGKILL)  # stragglers (engine core) of the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.tmpdir is not None:
            self.left_in_tmpdir = _emptied(self.tmpdir)
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        return self.proc.returncode

    # ------------------------------------------------------------------ requests

    def completion(
        self, prompt: Sequence[int], *, max_tokens: int = 8, timeout: float = 180.0, **extra: Any
    ) -> tuple[int, dict[str, Any]]:
        """POST /v1/completions with token ids, temperature 0; (HTTP status, JSON body)."""
        body = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
            **extra,
        }
        req = urllib.request.Request(
            f"{self.url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                return e.code, json.loads(text)
            except json.JSONDecodeError:
                return e.code, {"error": text}


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # the server was started with start_new_session: pgid == pid


def start(
    argv: Sequence[str],
    *,
    port: int,
    model: str,
    log_path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
) -> Server:
    """Start `argv` (a vllm serve command listening on 127.0.0.1:`port`) in its own process group."""
    if "--host" in argv and argv[list(argv).index("--host") + 1] != LOOPBACK:
        raise ServingError(
            "test servers listen on loopback only",
            argument="--host",
            expected=LOOPBACK,
            found="another host",
            fix=f"pass --host {LOOPBACK} or leave --host out of the command",
        )
    log = Path(log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    # A $TMPDIR of the server's own: what its processes leave there (a killed vLLM's IPC sockets) goes with it, and
    # `left_in_tmpdir` says what that was. Short: vLLM's socket paths under it must fit a Unix socket's 107 bytes.
    tmpdir = tempfile.mkdtemp(prefix="srv_")
    env = {**(os.environ if env is None else env), "TMPDIR": tmpdir}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return Server(proc, port, log, model, tmpdir=tmpdir)


def token_ids(body: Mapping[str, Any]) -> list[int]:
    """The generated token ids of a /v1/completions response (needs return_token_ids=true)."""
    try:
        ids = body["choices"][0]["token_ids"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ServingError(
            "the completion response has no token ids",
            argument="response",
            expected="choices[0].token_ids (request with return_token_ids=true)",
            found=json.dumps(body)[:500],
            fix='send the /v1/completions request with "return_token_ids": true and check the server log for errors',
        ) from exc
    if ids is None:
        raise ServingError(
            "the completion response has token_ids=null",
            argument="response",
            found=str(body)[:500],
            fix='send the /v1/completions request with "return_token_ids": true (a vLLM that supports it)',
        )
    return [int(t) for t in ids]


def _emptied(folder: str, limit: float = 10.0) -> list[str]:
    """The folder's entries, once nothing of ours is left or `limit` has run out: the watcher of `maxtext-compat
    serve` removes what the command made once the server's last process has exited, a moment after the stop."""
    deadline = time.monotonic() + limit
    while True:
        left = sorted(os.listdir(folder))
        if not any(n.startswith("maxtext_compat") for n in left) or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)
