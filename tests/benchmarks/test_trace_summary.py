import gzip
import json

from benchmarks.trace_summary import load_events, summarize


def _trace():
    def x(cat, name, ts, dur, tid=7):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}

    return {"traceEvents": [
        x("kernel", "gemm", 0, 10), x("kernel", "gemm", 5, 10, tid=9),  # overlapping on two streams: busy 0..15
        x("gpu_memcpy", "Memcpy HtoD", 20, 2),  # idle gap 15..20
        x("kernel", "attn", 30, 5),  # idle gap 22..30
        x("kernel", "attn", 300, 5),  # idle gap 35..300
        x("cpu_op", "aten::mm", 0, 100),  # host events are not device time
    ]}


def test_device_time_per_kernel_busy_share_and_idle_gaps(tmp_path):
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(_trace()).encode()))
    s = summarize(load_events(path))
    assert s["kernels"][0] == ("gemm", 2, 20.0)
    assert s["span_us"] == 305.0 and s["busy_us"] == 15.0 + 2.0 + 5.0 + 5.0
    assert s["gaps_us"] == [265.0, 8.0, 5.0] and s["gaps_over_100us"] == 265.0
    assert [st[:3] for st in s["streams"]] == [("7", 4, 22.0), ("9", 1, 10.0)]
    assert summarize(load_events(path), stream_top=1)["streams"][0][3] == [("gemm", 1, 10.0)]
