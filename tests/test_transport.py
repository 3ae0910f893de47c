import asyncio

import numpy as np
import pytest

from vllm_voxserve.transport import AUDIO, END, ERROR, AudioReceiver, AudioSender, new_stream_key


def test_audio_arrives_in_order_per_stream_and_unknown_streams_are_dropped():
    async def scenario():
        receiver = AudioReceiver()
        receiver.start()
        sender = AudioSender()
        a, b, stray = new_stream_key(), new_stream_key(), new_stream_key()
        qa, qb = receiver.open(a), receiver.open(b)
        chunks = [np.arange(i, i + 5, dtype=np.float32) for i in range(3)]
        for seq, chunk in enumerate(chunks):
            sender.send_audio(receiver.address, a, seq, chunk)
            sender.send_audio(receiver.address, stray, seq, chunk)  # nobody listens: dropped
        sender.send_end(receiver.address, a, 3)
        sender.send_error(receiver.address, b, 0, "codec failed")
        got = [await asyncio.wait_for(qa.get(), 5) for _ in range(4)]
        err = await asyncio.wait_for(qb.get(), 5)
        sender.close()
        await receiver.aclose()
        return got, err

    got, err = asyncio.run(scenario())
    assert [kind for kind, _ in got] == [AUDIO, AUDIO, AUDIO, END]
    for (_, payload), expected in zip(got, range(3)):
        np.testing.assert_array_equal(payload, np.arange(expected, expected + 5, dtype=np.float32))
    assert err == (ERROR, "codec failed")


def one_stream(send, count: int) -> list:
    """The first `count` items one stream's queue receives from what `send(sender, address, key)` sends."""
    async def scenario():
        receiver = AudioReceiver()
        receiver.start()
        sender = AudioSender()
        key = new_stream_key()
        queue = receiver.open(key)
        send(sender, receiver.address, key)
        got = [await asyncio.wait_for(queue.get(), 5) for _ in range(count)]
        sender.close()
        await receiver.aclose()
        return got

    return asyncio.run(scenario())


def test_rows_of_a_larger_array_and_other_dtypes_arrive_as_their_float32_samples():
    """The sender passes contiguous float32 rows without a copy and converts anything else."""
    batch = np.arange(3 * 20000, dtype=np.float32).reshape(3, 20000)  # a row above zmq's copy threshold

    def send(sender, address, key):
        sender.send_audio(address, key, 0, batch[1, :19200])
        sender.send_audio(address, key, 1, batch[:, 7])  # strided: copied
        sender.send_audio(address, key, 2, np.array([0.5, -0.25]))  # float64: converted

    got = one_stream(send, 3)
    assert [kind for kind, _ in got] == [AUDIO] * 3
    np.testing.assert_array_equal(got[0][1], batch[1, :19200])
    np.testing.assert_array_equal(got[1][1], batch[:, 7])
    np.testing.assert_array_equal(got[2][1], np.array([0.5, -0.25], dtype=np.float32))


def test_a_gap_in_sequence_numbers_is_reported_not_played():
    def send(sender, address, key):
        sender.send_audio(address, key, 1, np.zeros(3, dtype=np.float32))  # seq 0 never sent

    [(kind, message)] = one_stream(send, 1)
    assert kind == ERROR and "out of order" in message


@pytest.mark.parametrize("argv, expected", [
    (["vllm", "serve", "m", "--plugin", "voxserve"], True),
    (["vllm", "serve", "m", "--plugin=other,voxserve"], True),
    (["vllm", "serve", "m", "--plugin", "other"], False),
    (["vllm", "serve", "m"], False),
])
def test_plugin_flag_is_read_from_the_command_line(argv, expected):
    from vllm_voxserve.compat import plugin_requested_on_command_line

    assert plugin_requested_on_command_line(argv) is expected
