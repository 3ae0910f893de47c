"""Streaming text in with vLLM data parallelism on CPU (two engine cores, each with its scheduler and worker; the
speech service in this process steering requests to ranks): text streams on either rank, and one that rank 0
refuses and rank 1 then serves, are fed word by word with pauses the requests wait through, and each speaks what
one request with the whole text speaks: their text reaches the rank that runs them."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

pytest.importorskip("vllm")
from tests.entrypoints.test_text_stream_engine import TEXT, WORD_GAP_S, streamed, whole_text, words  # noqa: E402
from tests.entrypoints.text_stream_engine import speech_engine  # noqa: E402
from tests.speech_server import make_tiny_checkpoint  # noqa: E402
from vllm_voxserve.fault_injection import REFUSE_ENV  # noqa: E402

pytestmark = [pytest.mark.slow]

REFUSED_SEED = 5  # rank 0 refuses this one
# one chunk per codec call: equal codes give identical audio whatever else a rank decodes beside them
CONFIG = {"voxserve": {"scheduler": {"overload_mode": "off"}}, "voxserve_internal": {"max_codec_batch": 1}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    checkpoint = make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")
    mp = pytest.MonkeyPatch()
    mp.setenv(REFUSE_ENV, f"0:{REFUSED_SEED}")  # the engine-core processes read it at start

    async def run():
        async with speech_engine(checkpoint, data_parallel_size=2, additional_config=CONFIG) as service:
            assert service.ranks.num_ranks == 2
            engine, sent = service.engine_client, []
            generate = engine.generate

            def recording_generate(prompt, params, request_id, **kwargs):
                sent.append((request_id, kwargs.get("data_parallel_rank")))
                return generate(prompt, params, request_id, **kwargs)

            engine.generate = recording_generate
            whole = await whole_text(service)
            together = await asyncio.gather(*(streamed(service, words(TEXT), WORD_GAP_S, seed=seed)
                                              for seed in (1, 2)))
            service.ranks._start = 0  # rank 0 is asked first (round robin), and refuses
            refused = await streamed(service, words(TEXT), WORD_GAP_S, seed=REFUSED_SEED)
            return whole, together, refused, sent

    try:
        return asyncio.run(run())
    finally:
        mp.undo()


def test_text_streams_on_both_ranks_and_one_retried_on_another_rank_speak_the_whole_texts_audio(runs):
    whole, together, refused, sent = runs
    assert len(whole) > 0
    assert sorted(rank for _, rank in sent[1:3]) == [0, 1]  # the two streams ran on different ranks
    assert [rank for _, rank in sent[3:]] == [0, 1]  # rank 0 refused the last, rank 1 served it
    for audio in [*together, refused]:
        np.testing.assert_array_equal(audio, whole)
