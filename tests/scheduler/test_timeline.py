import pytest

from vllm_voxserve.scheduler.timeline import ChunkSchedule, PlaybackTimeline


def test_uniform_chunks():
    s = ChunkSchedule(first_chunk_frames=10, chunk_frames=10, frame_duration_s=0.08)
    assert [s.start_frame(k) for k in range(4)] == [0, 10, 20, 30]
    assert [s.chunk_of_frame(f) for f in (0, 9, 10, 19, 20)] == [0, 0, 1, 1, 2]
    assert s.num_chunks(25) == 3 and s.num_chunks(30) == 3 and s.num_chunks(0) == 0
    assert s.audio_before(3) == pytest.approx(2.4)


def test_shorter_first_chunk():
    s = ChunkSchedule(first_chunk_frames=4, chunk_frames=10)
    assert [s.start_frame(k) for k in range(4)] == [0, 4, 14, 24]
    assert [s.chunk_of_frame(f) for f in (3, 4, 13, 14)] == [0, 1, 1, 2]
    assert s.audio_before(1) == pytest.approx(0.32)


def test_ready_when_full_or_last_partial():
    s = ChunkSchedule()
    assert not s.is_ready(0, 9, generation_done=False)
    assert s.is_ready(0, 10, generation_done=False)
    assert s.is_ready(1, 13, generation_done=True)  # last, partial chunk
    assert not s.is_ready(2, 13, generation_done=True)  # does not exist


def test_deadlines_follow_playback_from_first_audio():
    # Equation 2: chunk k must arrive before first_audio + duration of chunks 0..k-1.
    t = PlaybackTimeline(ChunkSchedule(), arrival_time=10.0, ttfa_target_s=0.2, first_audio_time=10.15)
    assert t.deadline(0) == pytest.approx(10.2)  # the TTFA target
    assert t.deadline(1) == pytest.approx(10.15 + 0.8)
    assert t.deadline(3) == pytest.approx(10.15 + 2.4)


def test_deadlines_before_first_audio_use_latest_start():
    t = PlaybackTimeline(ChunkSchedule(), arrival_time=1.0, ttfa_target_s=0.2)
    assert t.deadline(1) == pytest.approx(1.2 + 0.8)
