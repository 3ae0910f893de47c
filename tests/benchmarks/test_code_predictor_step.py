from benchmarks.code_predictor_step import build, make_variants


def test_the_compared_frames_are_built_with_their_settings():
    """Built on the CPU (compiling is lazy): the GPU run is the only other place this code runs."""
    variants = make_variants(build("0.6b", "cpu"), autotune=True)
    assert list(variants) == ["reference", "fused", "fused+compile", "fused+compile+kernels", "fused+autotune"]
    assert variants["reference"] is None and not variants["fused"]._compiled
    assert [variants[n].kernels for n in ("fused+compile", "fused+compile+kernels", "fused+autotune")] == [
        False, True, False]
    assert "fused+autotune" not in make_variants(build("0.6b", "cpu"))
