"""What a user may set: the `voxserve` section takes the settings and refuses every other field naming it; the
`voxserve_internal` section takes the other fields and refuses the settings."""

import dataclasses

import pytest

from vllm_voxserve.config import (INTERNAL_CONFIG_KEY, SETTINGS, VoxServeConfig, as_additional_config, field_keys,
                                  process_config, split_tree)


def nested(key: str, value) -> dict:
    """{"a": {"b": value}} for "a.b"."""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def default(key: str):
    """A field's default, as a config without any setting resolves it."""
    config = VoxServeConfig()
    if key.startswith("scheduler."):
        return getattr(config.scheduler_policy(), key.split(".", 1)[1])
    value = config.to_dict()
    for part in key.split("."):
        value = value[part]
    return list(value) if isinstance(value, tuple) else value


def resolved(config: VoxServeConfig) -> tuple:
    """A config as its components see it (the raw scheduler mapping resolved into the policy)."""
    return dataclasses.replace(config, scheduler={}), config.scheduler_policy()


def test_about_twenty_settings_all_of_them_fields():
    assert 15 <= len(SETTINGS) <= 24
    assert SETTINGS < field_keys()


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_each_setting_is_taken_from_the_users_section_and_refused_in_the_internal_one(key):
    assert resolved(VoxServeConfig.from_dict(nested(key, default(key)))) == resolved(VoxServeConfig())
    with pytest.raises(ValueError, match=f"{INTERNAL_CONFIG_KEY} keys \\['{key}'\\] are settings"):
        VoxServeConfig.from_dict({}, internal=nested(key, default(key)))


@pytest.mark.parametrize("key", sorted(field_keys() - SETTINGS))
def test_every_other_field_is_refused_among_the_settings_naming_it_and_taken_in_the_internal_section(key):
    with pytest.raises(ValueError, match=f"voxserve keys \\['{key}'\\] are internal"):
        VoxServeConfig.from_dict(nested(key, default(key)))
    assert resolved(VoxServeConfig.from_dict({}, internal=nested(key, default(key)))) == resolved(VoxServeConfig())


def test_a_setting_changes_the_config_and_an_unknown_key_is_named():
    config = VoxServeConfig.from_dict({"scheduler": {"overload_mode": "off"}, "lanes": {"split": {"group_sms": 32}}})
    assert config.scheduler_policy().overload_mode == "off" and config.lanes.split.group_sms == 32
    with pytest.raises(ValueError, match="unknown voxserve keys \\['lanes.split.sm'\\]"):
        VoxServeConfig.from_dict({"lanes": {"split": {"sm": 32}}})
    with pytest.raises(ValueError, match="voxserve must be an object"):
        VoxServeConfig.from_dict([("chunk_frames", 5)])


def test_a_tree_of_any_fields_parts_into_the_two_sections():
    tree = {"chunk_frames": 8, "codec_compile": False,
            "scheduler": {"overload_mode": "off", "admission_mode": "prefill_first"},
            "lanes": {"use_graphs": False, "split": {"group": "lm", "group_sms": 40}}}
    settings, internal = split_tree(tree)
    assert settings == {"chunk_frames": 8, "scheduler": {"overload_mode": "off"}, "lanes": {"split": {"group_sms": 40}}}
    assert internal == {"codec_compile": False, "scheduler": {"admission_mode": "prefill_first"},
                        "lanes": {"use_graphs": False, "split": {"group": "lm"}}}
    config = process_config(as_additional_config(tree))
    assert config == VoxServeConfig.from_tree(tree)
    assert (config.chunk_frames, config.codec_compile, config.lanes.split.group) == (8, False, "lm")
    assert config.scheduler_policy().admission_mode == "prefill_first"
    assert process_config({"voxserve": settings}) != config  # the internal section is part of the parsed config
