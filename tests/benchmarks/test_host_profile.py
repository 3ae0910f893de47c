import lzma

from benchmarks.host_profile import callees, parse, report, shares, short_frame

RAW = """\
process 7:"python3 -m vllm";thread (11): MainThread;run (/usr/lib/python3/dist-packages/vllm/engine/core.py);step (/usr/lib/python3/dist-packages/vllm/engine/core.py);pump (/work/main/vllm_voxserve/worker/chunk_dispatch.py) 30
process 7:"python3 -m vllm";thread (11): MainThread;run (/usr/lib/python3/dist-packages/vllm/engine/core.py);step (/usr/lib/python3/dist-packages/vllm/engine/core.py) 10
process 7:"python3 -m vllm";thread (11): MainThread;run (/usr/lib/python3/dist-packages/vllm/engine/core.py);recurse (x.py);recurse (x.py) 60
process 7:"python3 -m vllm";thread (12): Thread-1;loop (/opt/a/b/c/io.py) 5
not a sample line
"""


def test_frames_keep_the_path_from_the_package_on():
    assert short_frame("step (/usr/lib/python3/dist-packages/vllm/engine/core.py)") == "step (vllm/engine/core.py)"
    assert short_frame("pump (/work/main/vllm_voxserve/worker/chunk_dispatch.py)") == \
        "pump (vllm_voxserve/worker/chunk_dispatch.py)"
    assert short_frame("loop (/opt/a/b/c/io.py)") == "loop (c/io.py)"


def test_samples_split_by_thread_with_inclusive_and_self_shares():
    threads = parse(RAW)
    assert sorted(threads) == ["MainThread", "Thread-1"]
    total, inclusive, own = shares(threads["MainThread"])
    assert total == 100
    assert inclusive["run (vllm/engine/core.py)"] == 100
    assert inclusive["step (vllm/engine/core.py)"] == 40
    assert inclusive["recurse (x.py)"] == 60  # a recursive function counts once per stack
    assert own["pump (vllm_voxserve/worker/chunk_dispatch.py)"] == 30 and own["step (vllm/engine/core.py)"] == 10


def test_report_names_the_busiest_threads_first(tmp_path):
    path = tmp_path / "stacks.txt"
    path.write_text(RAW)
    text = report(path, top=3)
    assert text.splitlines()[0].endswith("MainThread 100, Thread-1 5")
    assert "  40.0%  step (vllm/engine/core.py)" in text
    assert "  60.0%  recurse (x.py)" in text


def test_what_a_function_called_in_shares_of_the_thread(tmp_path):
    total, below = callees(parse(RAW)["MainThread"], "step (vllm")
    assert total == 100 and below == {"pump (vllm_voxserve/worker/chunk_dispatch.py)": 30, "<self>": 10}
    path = tmp_path / "stacks.txt.xz"
    path.write_bytes(lzma.compress(RAW.encode()))
    text = report(path, thread="MainThread", under="run (vllm")
    assert "  60.0%  recurse (x.py)" in text and "  40.0%  step (vllm/engine/core.py)" in text
