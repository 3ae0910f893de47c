"""Each process parses the voxserve config once: every component asking for it gets the same frozen object."""

import dataclasses

import pytest

from vllm_voxserve.config import VoxServeConfig, process_config


def test_the_same_section_gives_the_same_object():
    first = process_config({"voxserve": {"chunk_frames": 7, "scheduler": {"max_decode_batch": 16}}})
    again = process_config({"voxserve": {"scheduler": {"max_decode_batch": 16}, "chunk_frames": 7}})
    assert again is first and first.chunk_frames == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.chunk_frames = 8


def test_a_changed_section_is_a_new_config():
    before = process_config({"voxserve": {"chunk_frames": 9}})
    after = process_config({"voxserve": {"chunk_frames": 9, "max_codec_slots": 3}})  # the config hook's defaults
    assert after is not before and after.max_codec_slots == 3
    assert process_config(None) == VoxServeConfig()


def test_a_bad_section_raises_every_time():
    for _ in range(2):
        with pytest.raises(ValueError, match="unknown voxserve keys"):
            process_config({"voxserve": {"no_such_key": 1}})
