import pytest
import torch

from benchmarks.codec_step import make_program
from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder
from vllm_voxserve.models.qwen3_tts.codec.layers import CONV, ResidualUnit


def test_the_compared_codecs_are_built_in_the_served_form():
    """Built on the CPU (compiling is lazy): the GPU run is the only other place this code runs."""
    with torch.device("meta"):
        decoder = CodecDecoder(CodecDecoderConfig())
    programs = {name: make_program(decoder, name) for name in ("graph", "graph+compile")}
    assert [p._compiled is not None for p in programs.values()] == [False, True]
    # each variant on its own copy in the served forms; the given decoder stays plain
    assert len({id(p.decoder) for p in programs.values()} | {id(decoder)}) == 3
    for program in programs.values():
        assert all(u.conv1.form != CONV for u in program.decoder.modules() if isinstance(u, ResidualUnit))
    assert all(u.conv1.form == CONV for u in decoder.modules() if isinstance(u, ResidualUnit))
    with pytest.raises(ValueError, match="unknown variant"):
        make_program(decoder, "graph+compile+nhwc")
