"""Streaming text in, without a server (`entrypoints.text_stream`): the held-back trailing word keeps the token ids
those of the whole text, the request starts with the first certain token and gets the rest in order through the text
RPC, `end` / `cancel` end the audio, and the text's limits hold."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

pytest.importorskip("vllm")
from tests.entrypoints.fake_audio_receiver import FakeReceiver  # noqa: E402
from tests.speech_server import make_tiny_checkpoint  # noqa: E402
from vllm_voxserve.config import VoxServeConfig  # noqa: E402
from vllm_voxserve.contract import TEXT_CLOSED, TEXT_ENDED, TEXT_OPEN, TEXT_RPC_METHOD  # noqa: E402
from vllm_voxserve.entrypoints.speech_request import SpeechRequest  # noqa: E402
from vllm_voxserve.entrypoints.speech_service import InvalidSpeechRequest, SpeechService  # noqa: E402
from vllm_voxserve.entrypoints.text_stream import TextStream, TextTokens  # noqa: E402
from vllm_voxserve.models.qwen3_tts.job import SpeechJob  # noqa: E402
from vllm_voxserve.models.qwen3_tts.tokenizer import load_text_tokenizer, target_text_ids  # noqa: E402
from vllm_voxserve.transport import AUDIO, END  # noqa: E402

TEXT = "Hello, world! This is a test of streaming text, 42 times.\nThen a new line: “quoted” words... done."


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom-voice")


@pytest.fixture(scope="module")
def tokenize(checkpoint):
    tokenizer = load_text_tokenizer(checkpoint)
    return lambda text: target_text_ids(tokenizer, text)


def pieces_of(text: str, sizes: list[int]) -> list[str]:
    out, i, k = [], 0, 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        out.append(text[i : i + n])
        i, k = i + n, k + 1
    return out


@pytest.mark.parametrize("sizes", [[1], [2, 5, 3], [7], [len(TEXT)]])
def test_pieces_give_the_token_ids_of_the_whole_text(tokenize, sizes):
    tokens = TextTokens(tokenize, 4096)
    for piece in pieces_of(TEXT, sizes):
        tokens.add(piece)
        tokens.take_words()
        assert tokens.ids == tokenize(TEXT)[: len(tokens.ids)]  # never an id the whole text would not have
    tokens.take_all()
    assert tokens.ids == tokenize(TEXT)


def test_the_trailing_word_is_held_back_until_a_space_follows_or_a_flush(tokenize):
    tokens = TextTokens(tokenize, 4096)
    tokens.add("Hello wor")
    assert tokens.take_words() == tokenize("Hello")
    tokens.add("ld")
    assert tokens.take_words() == []  # "world" may still grow
    tokens.add(" and")
    assert tokens.take_words() == tokenize(" world")
    assert tokens.take_all() == tokenize(" and")  # flush: the partial word goes too
    assert tokens.take_all() == []


def test_text_past_the_limit_is_refused(tokenize):
    tokens = TextTokens(tokenize, 10)
    tokens.add("0123456789")
    with pytest.raises(ValueError, match="at most 10"):
        tokens.add("x")


class TextEngine:
    """An engine client whose request plays one chunk per text call after it starts, and ends when the text has
    ended; records the request's job and every text call."""

    def __init__(self, receiver):
        self.receiver = receiver
        self.jobs: list[SpeechJob] = []
        self.text_calls: list[tuple] = []
        self.aborted = asyncio.Event()
        self.ended = asyncio.Event()

    async def generate(self, prompt, params, request_id, **kwargs):
        job = SpeechJob.from_extra_args(params.extra_args)
        self.jobs.append(job)
        queue = self.receiver.queues[job.stream_key]
        queue.put_nowait((AUDIO, np.zeros(4, np.float32)))
        try:
            if job.text_stream:
                await self.ended.wait()
            queue.put_nowait((AUDIO, np.ones(4, np.float32)))
            queue.put_nowait((END, None))
            yield types.SimpleNamespace(finished=True, outputs=[types.SimpleNamespace(
                stop_reason=None, finish_reason="length", token_ids=[1, 2, 3])])
        except asyncio.CancelledError:
            self.aborted.set()
            raise

    async def collective_rpc(self, method, args=()):
        if method == TEXT_RPC_METHOD:
            self.text_calls.append(args)
            if args[3] == TEXT_ENDED:
                self.ended.set()
        return [{"status": 200}]


def service_on(checkpoint, max_input_chars: int = 4096) -> SpeechService:
    service = SpeechService(None, str(checkpoint), ["tiny"], VoxServeConfig(max_input_chars=max_input_chars))
    service.receiver = FakeReceiver()
    service.receiver.address = "ipc://unused"
    service.engine_client = service.cancels.engine_client = TextEngine(service.receiver)
    return service


def request(text: str = "") -> SpeechRequest:
    return SpeechRequest(input=text, voice="ryan", max_new_tokens=64, ignore_eos=True, seed=1)


def test_a_stream_starts_with_the_first_word_and_sends_the_rest_in_order(checkpoint, tokenize):
    service = service_on(checkpoint)
    engine = service.engine_client

    async def run():
        stream = service.open_text_stream(request())
        heard = asyncio.get_running_loop().create_task(_collect(stream))
        for word in TEXT.split(" "):
            await stream.append(word + " ")
            await asyncio.sleep(0)
        await stream.end()
        return stream, await heard

    stream, chunks = asyncio.run(run())
    assert len(engine.jobs) == 1
    job = engine.jobs[0]
    assert job.text_stream and job.prompt.non_streaming is False
    ids = list(job.prompt.text_ids)
    calls = [c for c in engine.text_calls if c[3] != TEXT_CLOSED]
    for key, start, sent, state in calls:
        assert key == job.stream_key and start == len(ids)  # in order, nothing missing or repeated
        ids += sent
    assert [c[3] for c in calls] == [TEXT_OPEN] * (len(calls) - 1) + [TEXT_ENDED]
    assert ids == tokenize(TEXT + " ")
    assert engine.text_calls[-1][3] == TEXT_CLOSED  # every rank drops the stream's text
    assert [c[0] for c in chunks] == [0.0, 1.0]
    assert stream.usage.input_tokens > len(ids) and stream.usage.output_tokens == 3


def test_text_that_ends_before_the_request_starts_goes_whole_in_the_job(checkpoint, tokenize):
    service = service_on(checkpoint)

    async def run():
        stream = service.open_text_stream(request("Hello there"))
        await stream.end()
        return await _collect(stream)

    assert len(asyncio.run(run())) == 2
    job = service.engine_client.jobs[0]
    assert not job.text_stream and list(job.prompt.text_ids) == tokenize("Hello there")
    assert service.engine_client.text_calls == []


async def _collect(stream) -> list[np.ndarray]:
    return [chunk async for chunk in stream.audio()]


async def stream_being_heard(service: SpeechService, text: str) -> tuple[TextStream, asyncio.Task]:
    """A text stream opened with `text` and the task collecting its audio, once its request has had time to start
    (the text holds a certain word, so the request starts at once)."""
    stream = service.open_text_stream(request())
    await stream.append(text)
    heard = asyncio.get_running_loop().create_task(_collect(stream))
    await asyncio.sleep(0.05)
    return stream, heard


def test_cancel_aborts_the_request_and_ends_the_audio(checkpoint):
    service = service_on(checkpoint)
    engine = service.engine_client

    async def run():
        stream, heard = await stream_being_heard(service, "Hello there, ")
        await stream.cancel()
        chunks = await asyncio.wait_for(heard, 1.0)
        with pytest.raises(InvalidSpeechRequest, match="cancelled"):
            await stream.append("more")
        return chunks

    assert len(asyncio.run(run())) <= 1
    assert engine.aborted.is_set()
    assert engine.text_calls[-1][3] == TEXT_CLOSED


def test_text_past_max_input_chars_and_after_end_is_refused(checkpoint):
    service = service_on(checkpoint, max_input_chars=20)

    async def run():
        stream = service.open_text_stream(request())
        await stream.append("0123456789 ")
        with pytest.raises(InvalidSpeechRequest, match="at most 20"):
            await stream.append("0123456789 ")
        await stream.end()
        with pytest.raises(InvalidSpeechRequest, match="ended"):
            await stream.append("x")
        await _collect(stream)

    asyncio.run(run())


def test_requests_a_text_stream_cannot_take_are_refused_when_opened(checkpoint):
    service = service_on(checkpoint)
    with pytest.raises(ValueError, match="non_streaming_mode"):
        service.open_text_stream(request().model_copy(update={"non_streaming_mode": True}))
    with pytest.raises(ValueError, match="voice"):
        service.open_text_stream(request().model_copy(update={"voice": None}))


def test_text_after_the_request_ended_sends_nothing(checkpoint):
    service = service_on(checkpoint)
    engine = service.engine_client

    async def run():
        stream, heard = await stream_being_heard(service, "Hello there ")
        engine.ended.set()  # the request ends on its own (the model's EOS) while the text is open
        await heard
        calls = len(engine.text_calls)
        await stream.append("more words ")
        await stream.end()
        return calls

    calls = asyncio.run(run())
    assert engine.text_calls[-1][3] == TEXT_CLOSED and len(engine.text_calls) == calls  # no text lingers anywhere
