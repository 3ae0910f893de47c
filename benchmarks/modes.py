"""Switching a server between scheduling modes: over HTTP when it can, otherwise by restarting it.

HTTP protocol (our server): `GET /voxserve/modes` -> `{"modes": [...], "current": NAME}` (a bare list is accepted
too), `POST /voxserve/mode` with `{"mode": NAME}` -> 200 once the mode is active. Restarting runs a user-given
shell command with `{mode}` replaced (other braces, e.g. JSON, are left alone) and waits until the server answers
its readiness path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Protocol

MODES_PATH = "/voxserve/modes"
MODE_PATH = "/voxserve/mode"


class ModeSwitchError(RuntimeError):
    pass


class ModeSwitcher(Protocol):
    def switch(self, mode: str) -> None:
        """Return once the server serves in `mode`."""

    def close(self) -> None:
        """Release anything the switcher started."""


def _http_json(url: str, body: dict | None = None, timeout_s: float = 30.0) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                     method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw.strip() else None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()[:300].decode("utf-8", "replace")


def _http_status(url: str, timeout_s: float = 5.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def server_modes(base_url: str, timeout_s: float = 10.0) -> tuple[list[str], str | None] | None:
    """(available modes, current mode) if the server has the mode endpoint, else None."""
    try:
        status, payload = _http_json(base_url.rstrip("/") + MODES_PATH, timeout_s=timeout_s)
    except (OSError, ValueError):
        return None
    if status != 200:
        return None
    if isinstance(payload, list):
        return [str(m) for m in payload], None
    if isinstance(payload, dict) and isinstance(payload.get("modes"), list):
        return [str(m) for m in payload["modes"]], payload.get("current")
    return None


class HttpModeSwitcher:
    """Switches a running server's mode in place (no restart, no graph re-capture)."""

    def __init__(self, base_url: str, switch_timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.switch_timeout_s = switch_timeout_s
        listed = server_modes(self.base_url)
        if listed is None:
            raise ModeSwitchError(f"{self.base_url}{MODES_PATH} is not available")
        self.available = listed[0]

    def switch(self, mode: str) -> None:
        if mode not in self.available:
            raise ModeSwitchError(f"server has no mode {mode!r}; it offers {self.available}")
        status, payload = _http_json(self.base_url + MODE_PATH, {"mode": mode}, timeout_s=self.switch_timeout_s)
        if status != 200:
            raise ModeSwitchError(f"switching to {mode!r} failed: HTTP {status}: {payload}")
        listed = server_modes(self.base_url)
        if listed is not None and listed[1] is not None and listed[1] != mode:
            raise ModeSwitchError(f"server reports mode {listed[1]!r} after switching to {mode!r}")

    def close(self) -> None:
        pass


class RestartModeSwitcher:
    """Starts the server once per mode from `command` (a shell line with `{mode}`), stopping the previous one."""

    def __init__(self, command: str, base_url: str, ready_path: str = "/health", ready_timeout_s: float = 1800.0,
                 log_dir: str | None = None):
        if "{mode}" not in command:
            raise ValueError("restart command must contain {mode}")
        self.command = command
        self.ready_url = base_url.rstrip("/") + ready_path
        self.ready_timeout_s = ready_timeout_s
        self.log_dir = log_dir
        self._process: subprocess.Popen | None = None
        self._log_file = None

    def switch(self, mode: str) -> None:
        self.close()
        if self.log_dir is not None:
            self._log_file = open(os.path.join(self.log_dir, f"server-{mode}.log"), "w")
        log = self._log_file or sys.stderr
        # Own session, so that stopping it stops the whole process tree the command starts, and nothing else.
        self._process = subprocess.Popen(self.command.replace("{mode}", mode), shell=True, start_new_session=True,
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ModeSwitchError(f"server for mode {mode!r} exited with {self._process.returncode}")
            if _http_status(self.ready_url) == 200:
                return
            time.sleep(1.0)
        self.close()
        raise ModeSwitchError(f"server for mode {mode!r} not ready within {self.ready_timeout_s} s")

    def close(self) -> None:
        self._stop_process()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _stop_process(self) -> None:
        if self._process is None or self._process.poll() is not None:
            self._process = None
            return
        pgid = self._process.pid  # the session leader's id is its process group id
        os.killpg(pgid, signal.SIGTERM)
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self._process.wait(timeout=30)
        self._process = None


def make_switcher(base_url: str, restart_command: str | None = None, ready_path: str = "/health",
                  ready_timeout_s: float = 1800.0, log_dir: str | None = None) -> ModeSwitcher:
    """HTTP switching if the server at `base_url` offers it, else restarts with `restart_command`."""
    if server_modes(base_url) is not None:
        return HttpModeSwitcher(base_url)
    if restart_command:
        return RestartModeSwitcher(restart_command, base_url, ready_path, ready_timeout_s, log_dir)
    raise ModeSwitchError(f"{base_url} does not offer {MODES_PATH} and no restart command was given (a voxserve "
                          "server offers it with --additional-config '{\"voxserve\": {\"admin_routes\": true}}')")
