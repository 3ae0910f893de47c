"""The whole protocol of one day (benchmarks/gpu_host/protocol_day.sh) against a stand-in for the one-start script:
the starts in their order with their modes, first rates and stages, the server stopped after each, the overload
stage skipped where no rate held 99 %, each start's host speeds where the report reads them, and the report of every
start against stock."""

import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

from tests.benchmarks.synthetic_record import LATE, ON_TIME, synthetic_record

ROOT = Path(__file__).resolve().parents[2]

# Logs each call, and where a sweep would have run writes its record as protocol.sh names it; start2's sweep held
# no rate at 99 %, so its overload stage fails as protocol.sh's does.
FAKE_PROTOCOL = r"""
[ "$STAGES" = stop ] && { echo stop >> "$CALLS"; exit 0; }
echo "$LABEL $MODE $START_RATE $STAGES" >> "$CALLS"
case " $STAGES " in *" serve "*) echo '{"python_per_s": 50000.0}' > "$OUT/host_$LABEL.json" ;; esac
case " $STAGES " in *" sweep wait "*) echo '{"python_per_s": 25000.0}' > "$OUT/host_after_sweep_$LABEL.json" ;; esac
case " $STAGES " in
  *" overload "*) [ "$LABEL" = start2 ] && exit 1
                  cp "$RECORDS/overload.json.xz" "$OUT/record_overload_$LABEL.json.xz" ;;
  *" sweep "*) cp "$RECORDS/sweep_$LABEL.json.xz" "$OUT/record_sweep_$LABEL.json.xz" ;;
esac
exit 0
"""


def xz_record(path: Path, record: dict) -> None:
    path.write_bytes(lzma.compress(json.dumps(record).encode()))


def test_two_starts_and_stock_in_one_command_then_one_report(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    on_time = lambda rate, seed, position: ON_TIME  # noqa: E731
    late = lambda rate, seed, position: LATE  # noqa: E731
    xz_record(records / "sweep_start1.json.xz", synthetic_record([56.0, 64.0], window_s=4.0, fate=on_time))
    xz_record(records / "sweep_start2.json.xz", synthetic_record([56.0], window_s=4.0, fate=late))
    xz_record(records / "overload.json.xz", synthetic_record([96.0], seeds=(0,), window_s=4.0, fate=late))
    xz_record(records / "sweep_stock.json.xz",
              synthetic_record([24.0, 32.0], window_s=4.0, fate=on_time, server="stock"))
    fake = tmp_path / "protocol.sh"
    fake.write_text(FAKE_PROTOCOL)
    out, calls = tmp_path / "day", tmp_path / "calls.txt"
    env = {**os.environ, "OUT": str(out), "START_RATE": "56", "PROTOCOL": str(fake), "PYTHON": sys.executable,
           "CALLS": str(calls), "RECORDS": str(records)}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_host" / "protocol_day.sh")], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == [
        "start1 voxserve 56 serve sweep wait", "start1 voxserve 56 overload wait", "stop",
        "start2 voxserve 56 serve sweep wait", "start2 voxserve 56 overload wait", "stop",
        "stock vllm-stock 24 serve sweep wait", "stop"]  # stock from 2/5 of our first rate, on the grid
    assert "start2: no overload stage" in done.stdout
    assert sorted(p.name for p in (out / "start1").iterdir()) == [
        "host.json", "host_after_sweep.json", "overload", "record_overload_start1.json.xz",
        "record_sweep_start1.json.xz", "sweep"]
    report = json.loads((out / "report" / "protocol.json").read_text())
    entries = report["entries"]
    assert [e["label"] for e in entries] == ["start1", "start2", "vllm-stock"]
    assert {(e["host_python_per_s"], e["host_after_sweep_python_per_s"]) for e in entries} == {(50000.0, 25000.0)}
    assert [r["rate"] for r in entries[0]["rates"]] == [56, 64, 96]  # the overload's rate joined to start1's sweep
    assert [r["rate"] for r in entries[1]["rates"]] == [56]
    assert entries[0]["capacity"]["0.99"]["rate"] == 64 and entries[2]["capacity"]["0.99"]["rate"] == 32
    held = report["held_on_every_start"]
    assert held["labels"] == ["start1", "start2"] and held["capacity"]["0.99"]["below"] == 56  # start2 missed at once


def test_a_start_whose_server_does_not_come_up_stops_the_day_with_the_server_stopped(tmp_path):
    fake = tmp_path / "protocol.sh"
    fake.write_text('echo "$STAGES" >> "$CALLS"; case " $STAGES " in *" serve "*) exit 1 ;; esac\n')
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "OUT": str(tmp_path / "day"), "START_RATE": "56", "PROTOCOL": str(fake),
           "CALLS": str(calls)}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_host" / "protocol_day.sh")], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1
    assert calls.read_text().splitlines() == ["serve sweep wait", "stop"]
