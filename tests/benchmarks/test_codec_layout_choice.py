import json

from benchmarks.codec_layout_choice import channels_last_faster, main

CONFIG = '{"voxserve":{"codec_dtype":"bfloat16"}}'


def result(served_16: float, nhwc_16: float) -> dict:
    return {"rows": [{"batch": 1, "graph+compile ms (whole GPU)": 1.76, "graph+compile+nhwc ms (whole GPU)": 1.19},
                     {"batch": 16, "graph+compile ms (whole GPU)": served_16,
                      "graph+compile+nhwc ms (whole GPU)": nhwc_16}]}


def test_channels_last_is_chosen_only_where_it_was_faster_at_the_largest_batch():
    assert channels_last_faster(result(11.31, 181.61))[0] is False  # session 6: faster at 1 chunk, not at 16
    assert channels_last_faster(result(11.31, 5.0)) == (True, "batch 16: channels-last 5.00 ms, served layout 11.31 ms")
    assert channels_last_faster({"rows": [{"batch": 16, "graph+compile ms (whole GPU)": 11.3}]})[0] is False


def test_main_prints_the_config_to_serve(tmp_path, capsys):
    (tmp_path / "fast.json").write_text(json.dumps(result(11.31, 5.0)))
    (tmp_path / "slow.json").write_text(json.dumps(result(11.31, 181.61)))
    main([str(tmp_path / "fast.json"), CONFIG])
    assert json.loads(capsys.readouterr().out) == {"voxserve": {"codec_dtype": "bfloat16", "codec_channels_last": True}}
    main([str(tmp_path / "slow.json"), CONFIG])
    assert json.loads(capsys.readouterr().out) == json.loads(CONFIG)
    main([str(tmp_path / "missing.json"), CONFIG])  # a failed microbenchmark: serve as configured
    assert json.loads(capsys.readouterr().out) == json.loads(CONFIG)
