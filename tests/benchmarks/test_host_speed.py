import json

from benchmarks import host_speed


def test_measure_gives_positive_rates_and_a_line_naming_the_cpu():
    speed = host_speed.measure(seconds=0.02, repeats=1)
    assert speed.python_per_s > 0 and speed.numpy_per_s > 0
    line = speed.line()
    assert line.startswith("host speed on one thread: python ") and speed.cpu in line


def test_rate_counts_passes_over_the_elapsed_time():
    calls = []
    rate = host_speed._rate(lambda: calls.append(1), seconds=0.02, repeats=2)
    # each run stops within one batch of 50 passes after its 0.02 s, so the rate is that of the work itself
    assert len(calls) % 50 == 0 and len(calls) >= 100
    assert rate > 50 / 0.02


def test_python_pass_keeps_the_rows_bookkeeping():
    rows = [host_speed._Row(f"r{i}") for i in range(3)]
    index = {row.request_id: row for row in rows}
    for _ in range(5):
        host_speed._python_pass(rows, index)
    assert [(row.frames, row.chunks) for row in rows] == [(5, 1)] * 3


def test_main_writes_the_figures_as_json(tmp_path, capsys):
    out = tmp_path / "host.json"
    assert host_speed.main(["--seconds", "0.01", "--repeats", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert set(figures) == {"cpu", "python_per_s", "numpy_per_s", "mhz_min", "mhz_max"}
    assert capsys.readouterr().out.startswith("host speed on one thread:")
