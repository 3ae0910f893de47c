import json
import socket
import sys
import urllib.request

import pytest

from benchmarks.modes import HttpModeSwitcher, ModeSwitchError, RestartModeSwitcher, make_switcher
from tests.benchmarks.fake_speech_server import FakeSpeechServer


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url):
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def test_http_switcher_switches_in_place():
    with FakeSpeechServer() as server:
        switcher = make_switcher(server.base_url, restart_command="never used {mode}")
        assert isinstance(switcher, HttpModeSwitcher) and switcher.available == ["fast", "slow"]
        switcher.switch("slow")
        assert server.mode == "slow"
        with pytest.raises(ModeSwitchError, match="no mode"):
            switcher.switch("turbo")


def test_restart_switcher_starts_and_stops_its_server(tmp_path):
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    # A stand-in server: a static file server whose directory is named after the mode.
    for mode in ("a", "b"):
        (tmp_path / mode).mkdir()
        (tmp_path / mode / "which").write_text(mode)
    # The JSON braces must survive: only {mode} is replaced.
    command = (f"echo '{{\"m\": \"{{mode}}\"}}' > {tmp_path}/started-{{mode}}.json && "
               f"exec {sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {tmp_path}/{{mode}}")
    with pytest.raises(ModeSwitchError):
        make_switcher(base_url)  # nothing there, no command
    switcher = make_switcher(base_url, command, ready_path="/which", ready_timeout_s=30, log_dir=str(tmp_path))
    assert isinstance(switcher, RestartModeSwitcher)
    try:
        for mode in ("a", "b"):
            switcher.switch(mode)
            assert urllib.request.urlopen(f"{base_url}/which", timeout=5).read().decode() == mode
            assert json.loads((tmp_path / f"started-{mode}.json").read_text()) == {"m": mode}
    finally:
        switcher.close()
    assert not answers(f"{base_url}/which")
    with pytest.raises(ValueError):
        RestartModeSwitcher("no placeholder", base_url)
