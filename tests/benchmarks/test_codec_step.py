import pytest
import torch

from benchmarks.codec_step import make_program
from vllm_voxserve.models.qwen3_tts.codec.configuration import CodecDecoderConfig
from vllm_voxserve.models.qwen3_tts.codec.decoder import CodecDecoder


def test_the_compared_codecs_are_built_with_their_settings():
    """Built on the CPU (compiling is lazy): the GPU run is the only other place this code runs."""
    with torch.device("meta"):
        decoder = CodecDecoder(CodecDecoderConfig())
    programs = {name: make_program(decoder, name) for name in
                ("graph", "graph+compile", "graph+compile+static-frames", "graph+compile+1x1mm", "graph+compile+nhwc")}
    assert [p._compiled is not None for p in programs.values()] == [False, True, True, True, True]
    assert programs["graph+compile"]._dynamic_dims[0] == (0, 2)
    assert programs["graph+compile+static-frames"]._dynamic_dims[0] == (0,)
    nhwc = programs["graph+compile+nhwc"].decoder
    assert nhwc is not decoder and nhwc.decoder[0].channels_last and not decoder.decoder[0].channels_last
    # each compiled variant on its own copy (the forms change the modules; each program compiles its own graphs)
    assert programs["graph"].decoder is decoder
    compiled = [p.decoder for name, p in programs.items() if name != "graph"]
    assert len({id(d) for d in compiled}) == 4 and decoder not in compiled
    gemm = make_program(decoder, "graph+compile+gemm").decoder
    assert gemm is not decoder and gemm.pre_conv.as_gemm and not decoder.pre_conv.as_gemm
    # bounded: the largest call, rows capped by the calls' rows, as the server bounds its codec
    assert make_program(decoder, "graph+compile+bounded", (64, 10)).shape_bounds == (64, 10)
    assert make_program(decoder, "graph+compile+bounded+rows16", (64, 10)).shape_bounds == (16, 10)
    assert make_program(decoder, "graph+compile", (64, 10)).shape_bounds is None
    with pytest.raises(ValueError, match="unknown variant"):
        make_program(decoder, "graph+compiled")
