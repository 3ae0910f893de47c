import json

from benchmarks.codec_layout_choice import fastest_variant, fig3_flags, main, split_from_fig3, switches

CONFIG = '{"voxserve":{"codec_dtype":"bfloat16"}}'


def result(**at_16) -> dict:
    big = {"batch": 16, **{f"graph+compile{v.replace('_', '+')} ms (whole GPU)": t for v, t in at_16.items()}}
    return {"rows": [{"batch": 1, "graph+compile ms (whole GPU)": 1.76, "graph+compile+nhwc ms (whole GPU)": 1.19},
                     big]}


def test_the_fastest_form_at_the_largest_batch_is_chosen():
    assert fastest_variant(result(**{"": 11.31, "_nhwc": 181.61}))[0] == "graph+compile"  # session 6
    best, why = fastest_variant(result(**{"": 11.31, "_nhwc": 181.61, "_gemm": 7.7, "_nhwc_gemm": 4.9}))
    assert best == "graph+compile+nhwc+gemm" and why.startswith("batch 16: graph+compile 11.31 ms")
    assert fastest_variant({"rows": [{"batch": 16, "graph ms (whole GPU)": 16.2}]})[0] is None  # serve as configured
    served = {"batch": 64, "graph+compile+dgemm ms (whole GPU)": 30.1, "graph+compile+nhwc+dgemm ms (whole GPU)": 27.4}
    assert fastest_variant({"rows": [served]})[0] == "graph+compile+nhwc+dgemm"  # against the served default
    capped = {**served, "graph+compile+nhwc+dgemm+rows16 ms (whole GPU)": 21.0}  # session 11's 4 x 5.25 ms
    assert fastest_variant({"rows": [capped]})[0] == "graph+compile+nhwc+dgemm+rows16"
    nhwc_only = {"batch": 64, "graph+compile+nhwc+dgemm ms (whole GPU)": 27.4}
    assert fastest_variant({"rows": [nhwc_only]})[0] is None  # nothing to be faster than


def test_main_prints_the_config_to_serve(tmp_path, capsys):
    (tmp_path / "gemm.json").write_text(json.dumps(result(**{"": 11.31, "_gemm": 7.7, "_nhwc": 181.6})))
    (tmp_path / "served.json").write_text(json.dumps(result(**{"": 11.31, "_nhwc": 181.61})))
    main([str(tmp_path / "gemm.json"), CONFIG])
    assert json.loads(capsys.readouterr().out) == {"voxserve": {"codec_dtype": "bfloat16",
                                                                "codec_channels_last": False,
                                                                "codec_gemm_low_rate_convs": True,
                                                                "codec_gemm_wide_dilated_convs": False,
                                                                "codec_rows_per_call": 0}}
    main([str(tmp_path / "served.json"), CONFIG])  # every switch as timed, whatever the defaults
    assert json.loads(capsys.readouterr().out) == {"voxserve": {"codec_dtype": "bfloat16",
                                                                "codec_channels_last": False,
                                                                "codec_gemm_low_rate_convs": False,
                                                                "codec_gemm_wide_dilated_convs": False,
                                                                "codec_rows_per_call": 0}}
    main([str(tmp_path / "missing.json"), CONFIG])  # a failed microbenchmark: serve as configured
    assert json.loads(capsys.readouterr().out) == json.loads(CONFIG)


def test_fig3_runs_the_forms_the_server_runs(capsys):
    assert fig3_flags(json.loads(CONFIG)) == ""
    both = {"voxserve": {"codec_channels_last": True, "codec_gemm_low_rate_convs": True}}
    assert fig3_flags(both) == "--codec-channels-last --codec-gemm-low-rate-convs"
    main(["--fig3-flags", json.dumps({"voxserve": {"codec_gemm_low_rate_convs": True,
                                                   "codec_gemm_wide_dilated_convs": False}})])
    assert capsys.readouterr().out.strip() == "--codec-gemm-low-rate-convs --no-codec-gemm-wide-dilated-convs"


def test_the_split_figure_3_chose_is_served_only_when_it_keeps_up(tmp_path, capsys):
    config = {"voxserve": {"lanes": {"background_max_batch": 32}}}
    chosen, _ = split_from_fig3({"chosen_codec_sms": 48, "chosen_keeps_up": True}, json.loads(json.dumps(config)))
    assert chosen["voxserve"]["lanes"] == {"background_max_batch": 32, "split": {"group": "codec", "group_sms": 48}}
    assert split_from_fig3({"chosen_codec_sms": 80, "chosen_keeps_up": False}, config)[0] == config
    (tmp_path / "fig3.json").write_text(json.dumps({"chosen_codec_sms": 48, "chosen_keeps_up": True}))
    main(["--split-from", str(tmp_path / "fig3.json"), CONFIG])
    assert json.loads(capsys.readouterr().out)["voxserve"]["lanes"]["split"]["group_sms"] == 48
    main(["--split-from", str(tmp_path / "missing.json"), CONFIG])
    assert json.loads(capsys.readouterr().out) == json.loads(CONFIG)


def test_a_variant_names_every_switch_it_ran_with():
    assert switches("graph+compile+nhwc+dgemm") == {"codec_channels_last": True, "codec_gemm_low_rate_convs": False,
                                                    "codec_gemm_wide_dilated_convs": True, "codec_rows_per_call": 0}
    assert switches("graph") is None and switches("graph+compile+1x1mm") is None  # not a served form
    best, _ = fastest_variant(result(**{"": 11.24, "_dgemm": 7.90, "_1x1mm": 1.0}))  # session 7, and a non-form
    assert best == "graph+compile+dgemm"
    assert switches("graph+compile+nhwc+dgemm+rows16") == {"codec_channels_last": True,
                                                           "codec_gemm_low_rate_convs": False,
                                                           "codec_gemm_wide_dilated_convs": True,
                                                           "codec_rows_per_call": 16}
    for unservable in ("graph+compile+rows0", "graph+compile+rows16+rows8", "graph+compile+rowsx", "graph+rows16"):
        assert switches(unservable) is None
