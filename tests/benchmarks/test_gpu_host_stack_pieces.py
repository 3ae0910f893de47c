"""The GPU stack cut into piece folders (benchmarks/gpu_host/stack_pieces.sh) and put back together on the GPU machine
(benchmarks/gpu_host/stack_stage.sh), with a stand-in for the bundle's install.sh that records what it was given."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKE_INSTALL = """#!/usr/bin/env bash
# installs nothing: records each part the first time it is present, and part 2 must come after part 1
src=$1 log=$(dirname "$0")/installed.txt
for p in part1.tar.xz part2 part3; do
  if [ -e "$src/$p" ] && ! grep -qx "$p" "$log" 2> /dev/null; then
    [ "$p" != part2 ] || grep -qx part1.tar.xz "$log" || exit 2
    echo "$p" >> "$log"
  fi
done
echo "export STACK=$src"
"""


def make_stack(root: Path) -> dict[str, bytes]:
    files = {"part1.tar.xz": os.urandom(2500), "part2/fa3.tar.xz": os.urandom(1800),
             "part2/a-1.0-py3-none-any.whl": os.urandom(300), "part3/b-2.0-py3-none-any.whl": os.urandom(700)}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def run(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_host" / script), *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_pieces_rebuild_the_stack_and_install_each_part_once_whole_in_order(tmp_path):
    files = make_stack(tmp_path / "stack")
    cut = run("stack_pieces.sh", str(tmp_path / "stack"), str(tmp_path / "pieces"), env={"MAX_BYTES": "1000"})
    assert cut.returncode == 0, cut.stderr
    folders = sorted(p for p in (tmp_path / "pieces").iterdir())
    assert len(folders) >= 5
    for folder in folders:
        assert sum(f.stat().st_size for f in folder.rglob("*.piece-*")) <= 1000
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "install.sh").write_text(FAKE_INSTALL)
    env = {"STAGE": str(tmp_path / "stage"), "INSTALL": str(tmp_path / "bin" / "install.sh")}
    installed_after = []
    for folder in folders:
        staged = run("stack_stage.sh", str(folder), env=env)
        assert staged.returncode == 0, staged.stderr
        assert staged.stdout.strip() == f"export STACK={tmp_path / 'stage' / 'stack'}"
        log = tmp_path / "bin" / "installed.txt"
        installed_after.append(log.read_text().split() if log.exists() else [])
    assert installed_after[0] == [] and installed_after[-1] == ["part1.tar.xz", "part2", "part3"]
    for rel, data in files.items():
        assert (tmp_path / "stage" / "stack" / rel).read_bytes() == data


def test_a_damaged_piece_is_refused(tmp_path):
    make_stack(tmp_path / "stack")
    assert run("stack_pieces.sh", str(tmp_path / "stack"), str(tmp_path / "pieces"),
               env={"MAX_BYTES": "100000"}).returncode == 0
    [folder] = (tmp_path / "pieces").iterdir()
    piece = folder / "part3" / "b-2.0-py3-none-any.whl.piece-00"
    piece.write_bytes(piece.read_bytes()[::-1])
    (tmp_path / "install.sh").write_text(FAKE_INSTALL)
    staged = run("stack_stage.sh", str(folder),
                 env={"STAGE": str(tmp_path / "stage"), "INSTALL": str(tmp_path / "install.sh")})
    assert staged.returncode == 3 and "sha256" in staged.stderr
