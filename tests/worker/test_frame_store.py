import pytest
import torch

from vllm_voxserve.worker.frame_store import FrameStore


def test_frames_scattered_in_one_write_come_back_per_stream_as_copies():
    store = FrameStore(num_slots=3, width=4, codes_per_frame=2, device=torch.device("cpu"))
    a, b = store.open(), store.open()
    step = torch.tensor([[1, 1], [2, 2]])  # one frame of a, one of b
    store.write(step, [a * 4 + 0, b * 4 + 0])
    step[0, 0] = 7  # the step's tensor is not kept
    store.write(torch.tensor([[3, 3], [4, 4]]), [b * 4 + 1, a * 4 + 1])
    first_of_a = store.take(a, 2)
    assert first_of_a.tolist() == [[1, 1], [4, 4]] and store.take(b, 2).tolist() == [[2, 2], [3, 3]]
    store.write(torch.tensor([[9, 9]]), [a * 4 + 0])  # a's next chunk starts over its rows
    assert first_of_a.tolist() == [[1, 1], [4, 4]] and store.take(a, 1).tolist() == [[9, 9]]  # the chunk: a copy


def test_slots_are_reused_and_run_out():
    store = FrameStore(num_slots=2, width=1, codes_per_frame=1, device=torch.device("cpu"))
    first = store.open()
    store.open()
    with pytest.raises(RuntimeError, match="no free frame store slot"):
        store.open()
    store.close(first)
    assert store.open() == first


def test_several_streams_taken_in_one_gather_come_back_as_their_own_frames():
    store = FrameStore(num_slots=3, width=4, codes_per_frame=2, device=torch.device("cpu"))
    a, b, c = store.open(), store.open(), store.open()
    store.write(torch.tensor([[1, 1], [2, 2], [3, 3], [4, 4], [5, 5]]), [a * 4, b * 4, a * 4 + 1, c * 4, b * 4 + 1])
    gathered, (of_c, of_a, of_b) = store.take_many([(c, 1), (a, 2), (b, 2)])
    assert of_a.tolist() == [[1, 1], [3, 3]] and of_b.tolist() == [[2, 2], [5, 5]] and of_c.tolist() == [[4, 4]]
    assert gathered.shape == (5, 2)
    store.write(torch.tensor([[9, 9]]), [a * 4])  # the slots' rows are free again: the chunks are copies
    assert of_a.tolist() == [[1, 1], [3, 3]]
