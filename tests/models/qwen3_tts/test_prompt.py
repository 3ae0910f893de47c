"""Prompt plans (pure Python): layouts of notes §1.3 and the validation errors."""
from __future__ import annotations

import pytest

from vllm_voxserve.models.qwen3_tts.checkpoint import official_config
from vllm_voxserve.models.qwen3_tts.prompt import (
    CodecKind,
    PromptTables,
    SpeechPrompt,
    TalkerGenerationRules,
    build_plan,
    plan_custom_voice,
    plan_voice_clone,
    plan_voice_design,
)

TEXT = (9707, 11, 1879, 0)
INSTRUCT = (151644, 872, 198, 41, 6647, 151645, 198)
PAD, BOS_T, EOS_T = 151671, 151672, 151673


def tables(kind: str, size: str = "1.7b") -> PromptTables:
    return PromptTables.from_config(official_config(size, kind))


def tokens(plan):
    return [(slot.kind, slot.value) for slot in plan.codec]


def tok(i):
    return (CodecKind.TOKEN, i)


NONE = (CodecKind.NONE, 0)


def test_custom_voice_streaming_layout_matches_the_notes_example():
    plan = plan_custom_voice(tables("custom_voice"), TEXT, "Ryan", "English", non_streaming=False)
    assert plan.text_ids == (151644, 77091, 198, PAD, PAD, PAD, PAD, PAD, BOS_T, TEXT[0])
    assert tokens(plan) == [NONE] * 3 + [tok(2154), tok(2156), tok(2050), tok(2157), tok(3061), tok(2148), tok(2149)]
    assert plan.trailing_text_ids == TEXT[1:] + (EOS_T,)
    assert plan.decode_text_id(len(TEXT)) == PAD


def test_custom_voice_non_streaming_puts_all_text_in_the_prefill():
    plan = plan_custom_voice(tables("custom_voice"), TEXT, "ryan", "auto", non_streaming=True)
    head = 3 + 5  # role + [nothink, think_bos, think_eos, speaker, pad]
    assert len(plan) == head + len(TEXT) + 1 + 1
    assert plan.text_ids[head:] == TEXT + (EOS_T, PAD)
    assert tokens(plan)[head:] == [tok(2148)] * (len(TEXT) + 1) + [tok(2149)]
    assert plan.trailing_text_ids == (PAD,)


@pytest.mark.parametrize("language,speaker,expected", [
    ("auto", "dylan", 2074), ("chinese", "eric", 2062), ("english", "eric", 2050), ("chinese", "ryan", 2055)])
def test_dialect_rule(language, speaker, expected):
    plan = plan_custom_voice(tables("custom_voice"), TEXT, speaker, language)
    assert tokens(plan)[3:7] == [tok(2154), tok(2156), tok(expected), tok(2157)]


def test_instruct_is_kept_on_1_7b_and_dropped_on_0_6b():
    big = plan_custom_voice(tables("custom_voice", "1.7b"), TEXT, "ryan", instruct_ids=INSTRUCT)
    small = plan_custom_voice(tables("custom_voice", "0.6b"), TEXT, "ryan", instruct_ids=INSTRUCT)
    assert big.text_ids[:len(INSTRUCT)] == INSTRUCT and len(big) == len(small) + len(INSTRUCT)
    assert small.text_ids[:3] == (151644, 77091, 198)


def test_voice_design_has_no_speaker_slot():
    plan = plan_voice_design(tables("voice_design"), TEXT, INSTRUCT, "english", non_streaming=False)
    assert plan.text_ids[:len(INSTRUCT)] == INSTRUCT
    assert tokens(plan)[len(INSTRUCT) + 3:] == [tok(2154), tok(2156), tok(2050), tok(2157), tok(2148), tok(2149)]


def test_base_icl_streaming_both_branches():
    t = tables("base")
    ref = (40, 1079)
    # text longer than the reference codes: the rest of the text trails
    long_text = plan_voice_clone(t, TEXT, "english", ref_text_ids=ref, num_ref_frames=2)
    icl = long_text.text_ids[3 + 6:]
    assert icl == (ref + TEXT)[:3] and long_text.trailing_text_ids == (ref + TEXT)[3:] + (EOS_T,)
    assert tokens(long_text)[3 + 6:] == [tok(2149), (CodecKind.REF_FRAME, 0), (CodecKind.REF_FRAME, 1)]
    assert tokens(long_text)[3 + 4] == (CodecKind.SPEAKER, 0)
    # reference longer than the text: padded with tts_pad inside the prefill
    long_ref = plan_voice_clone(t, TEXT, "english", ref_text_ids=ref, num_ref_frames=10)
    assert long_ref.text_ids[3 + 6:] == ref + TEXT + (EOS_T,) + (PAD,) * (11 - 7)
    assert long_ref.trailing_text_ids == (PAD,)


def test_base_icl_non_streaming_and_x_vector_only():
    t = tables("base")
    plan = plan_voice_clone(t, TEXT, ref_text_ids=(40,), num_ref_frames=3, non_streaming=True)
    tail_text, tail_codec = plan.text_ids[3 + 5:], tokens(plan)[3 + 5:]
    assert tail_text == (40,) + TEXT + (EOS_T,) + (PAD,) * 4
    assert tail_codec == [tok(2148)] * 6 + [tok(2149)] + [(CodecKind.REF_FRAME, f) for f in range(3)]
    xvec = plan_voice_clone(t, TEXT, "english", x_vector_only=True)
    assert tokens(xvec)[-3:] == [(CodecKind.SPEAKER, 0), tok(2148), tok(2149)]


@pytest.mark.parametrize("call,match", [
    (lambda: plan_custom_voice(tables("custom_voice"), TEXT, "nobody"), "unknown speaker.*ryan"),
    (lambda: plan_custom_voice(tables("custom_voice"), TEXT, "ryan", "klingon"), "unsupported language.*english"),
    (lambda: plan_custom_voice(tables("custom_voice"), TEXT, "ryan", "beijing_dialect"), "unsupported language"),
    (lambda: plan_custom_voice(tables("custom_voice"), (), "ryan"), "text_ids"),
    (lambda: plan_voice_design(tables("voice_design"), TEXT, ()), "VoiceDesign needs instruct"),
    (lambda: plan_voice_clone(tables("base"), TEXT), "ref_text_ids"),
    (lambda: plan_voice_clone(tables("base"), TEXT, ref_text_ids=(1,), num_ref_frames=0), "reference codes"),
    (lambda: plan_custom_voice(tables("base"), TEXT, "ryan"), "custom_voice"),
    (lambda: build_plan(tables("voice_design"), SpeechPrompt(TEXT, speaker="ryan", instruct_ids=INSTRUCT)),
     "speaker"),
    (lambda: build_plan(tables("base"), SpeechPrompt(TEXT, instruct_ids=INSTRUCT, x_vector_only=True)),
     "instruct_ids"),
])
def test_bad_input_raises_value_error_naming_the_choices(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_build_plan_uses_the_official_default_streaming_mode_per_kind():
    assert build_plan(tables("custom_voice"), SpeechPrompt(TEXT, speaker="ryan")).trailing_text_ids == (PAD,)
    base = build_plan(tables("base"), SpeechPrompt(TEXT, x_vector_only=True))
    assert base.trailing_text_ids == TEXT[1:] + (EOS_T,)


def test_generation_rules():
    rules = TalkerGenerationRules.from_tables(tables("custom_voice"))
    assert rules.eos_id == 2150 and rules.min_new_tokens == 2
    assert rules.suppressed_ids == tuple(i for i in range(2048, 3072) if i != 2150)
