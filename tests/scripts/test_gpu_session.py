"""scripts/gpu_session.sh with stand-ins for the jobs it starts: which server runs with which settings, on which GPU."""

import lzma
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDER = """#!/usr/bin/env bash
echo "OUT=$OUT RES=$RES MODES=$MODES START=${START_RATE:-} EXTRA=[${EXTRA_SERVE_ARGS:-}] CONFIG=$VOXSERVE_CONFIG" \\
  >> "$(dirname "$0")/calls.txt"
"""


def _stand_ins(tmp_path):
    """A copy of the script beside recording stand-ins for the jobs it starts, and a PATH with a silent nvidia-smi."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gpu_session.sh", tmp_path / "scripts")
    for stand_in in ("gpu_issue7.sh", "gpu_microbench.sh"):
        (tmp_path / "scripts" / stand_in).write_text(RECORDER)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SESSION_DIR": str(tmp_path / "session")}


def _wait_for(path):
    for _ in range(100):
        if path.exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def test_a_first_server_then_the_main_one_each_with_its_own_settings(tmp_path):
    env = {**_stand_ins(tmp_path),
           "GPU0_FIRST_MODES": "lanes", "GPU0_FIRST_START": "56", "GPU0_FIRST_CONFIG": '{"first":1}',
           "CONFIG": '{"main":1}', "GPU0_SERVE_ARGS": "--max-num-seqs 256", "GPU0_MODES": "vllm-stock,lanes",
           "START_RATE": "40", "GPU0_PARTS": "tests", "GPU1_PARTS": "none", "GPU1_MODES": ""}
    subprocess.run(["bash", "scripts/gpu_session.sh", "start"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=60)
    _wait_for(tmp_path / "session" / "gpu0" / "done")
    gpu0 = tmp_path / "session" / "gpu0"
    assert (tmp_path / "scripts" / "calls.txt").read_text().splitlines() == [
        f"OUT={gpu0}/first RES={gpu0}/first/run MODES=lanes START=56 EXTRA=[] CONFIG={{\"first\":1}}",
        f"OUT={gpu0} RES={gpu0}/run MODES=vllm-stock,lanes START=40 EXTRA=[--max-num-seqs 256] CONFIG={{\"main\":1}}",
        f"OUT={gpu0} RES={gpu0}/micro MODES=vllm-stock,lanes START=40 EXTRA=[] CONFIG={{\"main\":1}}",
    ]


def test_the_second_gpu_serves_with_its_own_settings_once_the_checkpoint_is_there(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "vocab.json").write_text("{}")
    env = {**_stand_ins(tmp_path), "CKPT": str(ckpt), "CKPT_SETTLE_S": "0", "CONFIG": '{"main":1}',
           "GPU0_MODES": "", "GPU1_PARTS": "none", "GPU1_MODES": "lanes", "GPU1_START": "56",
           "GPU1_CONFIG": '{"second":1}', "GPU1_SERVE_ARGS": "--compilation-config {}", "GPU1_PARTS_AFTER": "tests"}
    subprocess.run(["bash", "scripts/gpu_session.sh", "start"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=60)
    _wait_for(tmp_path / "session" / "gpu1" / "done")
    gpu1 = tmp_path / "session" / "gpu1"
    calls = (tmp_path / "scripts" / "calls.txt").read_text().splitlines()
    assert calls == [
        f"OUT={gpu1}/variant RES={gpu1}/variant/run MODES=lanes START=56 EXTRA=[--compilation-config {{}}] "
        f"CONFIG={{\"second\":1}}",
        f"OUT={gpu1} RES={gpu1}/micro_after MODES= START=56 EXTRA=[] CONFIG={{\"second\":1}}",
    ]


def test_collect_returns_each_record_compressed_and_not_raw(tmp_path):
    env = _stand_ins(tmp_path)
    run = tmp_path / "session" / "gpu0" / "run" / "ablation"
    run.mkdir(parents=True)
    (run / "record.json").write_text('{"modes": {}}' + " " * 10000)
    (tmp_path / "session" / "gpu1").mkdir()
    for gpu in ("gpu0", "gpu1"):
        (tmp_path / "session" / gpu / "done").touch()
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run(["bash", "scripts/gpu_session.sh", "collect"], cwd=tmp_path,
                            env={**env, "OUT": str(out), "WAIT_S": "1"}, capture_output=True, text=True, timeout=60)
    assert "all done" in result.stdout, result.stderr
    with tarfile.open(out / "snapshot.tgz") as snapshot:
        names = snapshot.getnames()
        assert "./gpu0/run/ablation/record.json.xz" in names and "./gpu0/run/ablation/record.json" not in names
        packed = snapshot.extractfile("./gpu0/run/ablation/record.json.xz").read()
    assert lzma.decompress(packed).decode().startswith('{"modes": {}}')
