"""scripts/gpu_session.sh on one GPU with stand-ins for the jobs it starts: which server runs with which settings."""

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDER = """#!/usr/bin/env bash
echo "OUT=$OUT RES=$RES MODES=$MODES START=${START_RATE:-} EXTRA=[${EXTRA_SERVE_ARGS:-}] CONFIG=$VOXSERVE_CONFIG" \\
  >> "$(dirname "$0")/calls.txt"
"""


def test_a_first_server_then_the_main_one_each_with_its_own_settings(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gpu_session.sh", tmp_path / "scripts")
    for stand_in in ("gpu_issue7.sh", "gpu_microbench.sh"):
        (tmp_path / "scripts" / stand_in).write_text(RECORDER)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SESSION_DIR": str(tmp_path / "session"),
           "GPU0_FIRST_MODES": "lanes", "GPU0_FIRST_START": "56", "GPU0_FIRST_CONFIG": '{"first":1}',
           "CONFIG": '{"main":1}', "GPU0_SERVE_ARGS": "--max-num-seqs 256", "GPU0_MODES": "vllm-stock,lanes",
           "START_RATE": "40", "GPU0_PARTS": "tests", "GPU1_PARTS": "none", "GPU1_MODES": ""}
    subprocess.run(["bash", "scripts/gpu_session.sh", "start"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=60)
    done = tmp_path / "session" / "gpu0" / "done"
    for _ in range(100):
        if done.exists():
            break
        time.sleep(0.1)
    gpu0 = tmp_path / "session" / "gpu0"
    assert (tmp_path / "scripts" / "calls.txt").read_text().splitlines() == [
        f"OUT={gpu0}/first RES={gpu0}/first/run MODES=lanes START=56 EXTRA=[] CONFIG={{\"first\":1}}",
        f"OUT={gpu0} RES={gpu0}/run MODES=vllm-stock,lanes START=40 EXTRA=[--max-num-seqs 256] CONFIG={{\"main\":1}}",
        f"OUT={gpu0} RES={gpu0}/micro MODES=vllm-stock,lanes START=40 EXTRA=[] CONFIG={{\"main\":1}}",
    ]
