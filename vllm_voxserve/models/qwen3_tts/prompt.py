"""Talker input plans for Qwen3-TTS (notes §1.3), in plain Python: no torch.

Every prefill position of the talker is the sum of a text-stream term `P(id) = text_projection(text_embedding(id))`
and a codec-stream term (a codec token embedding, the Base x-vector, the summed embedding of one ICL reference frame,
or nothing). A plan lists, per prefill position, the text id and the codec slot, plus the trailing text ids that the
decode steps add one per frame (after the last one: `P(tts_pad)`). Text comes in as token ids:
- `text_ids`: the tokens of the target text (the official `input_id[:, 3:-5]` of
  `<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`);
- `instruct_ids`: the tokens of the whole instruct block `<|im_start|>user\\n{instruct}<|im_end|>\\n`
  (`instruct_text()` gives the string to tokenize);
- `ref_text_ids`: the tokens of the reference transcript (the official `ref_ids[:, 3:-2]`).
"""
from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROLE_IDS = (151644, 77091, 198)  # <|im_start|> assistant \n: the official input_id[:, :3]


def target_text(text: str) -> str:
    """The string the official wrapper tokenizes for the target text (our plans take its inner tokens)."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(instruct: str) -> str:
    """The string the official wrapper tokenizes for an instruct; `instruct_ids` are all of its tokens."""
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def ref_text(text: str) -> str:
    """The string the official wrapper tokenizes for an ICL reference transcript (we take its tokens [3:-2])."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


class CodecKind(enum.IntEnum):
    NONE = 0  # text stream only
    TOKEN = 1  # talker.codec_embedding(value)
    SPEAKER = 2  # the x-vector given with the request
    REF_FRAME = 3  # sum of the 16 codebook embeddings of reference frame `value`


@dataclass(frozen=True, slots=True)
class CodecSlot:
    kind: CodecKind
    value: int = 0


NO_CODEC = CodecSlot(CodecKind.NONE)


@dataclass(frozen=True)
class PromptTables:
    """Ids and tables of one checkpoint (from its config), everything a plan needs."""

    model_type: str  # custom_voice | voice_design | base
    model_size: str  # tts_model_size, e.g. 1b7 or 0b6
    codec_vocab_size: int
    languages: Mapping[str, int]  # codec_language_id, dialects included
    speakers: Mapping[str, int]  # spk_id
    speaker_dialects: Mapping[str, Any]  # spk_is_dialect: a dialect name or False
    tts_pad: int = 151671
    tts_bos: int = 151672
    tts_eos: int = 151673
    codec_pad: int = 2148
    codec_bos: int = 2149
    codec_eos: int = 2150
    codec_think: int = 2154
    codec_nothink: int = 2155
    codec_think_bos: int = 2156
    codec_think_eos: int = 2157

    @classmethod
    def from_config(cls, config: Any) -> "PromptTables":
        """From a `Qwen3TTSConfig` or the dict of an official `config.json`."""
        c = config if isinstance(config, Mapping) else config.to_dict()
        t = c["talker_config"]
        return cls(
            model_type=c.get("tts_model_type") or "", model_size=c.get("tts_model_size") or "",
            codec_vocab_size=t["vocab_size"], languages=dict(t.get("codec_language_id") or {}),
            speakers=dict(t.get("spk_id") or {}), speaker_dialects=dict(t.get("spk_is_dialect") or {}),
            tts_pad=c.get("tts_pad_token_id", 151671), tts_bos=c.get("tts_bos_token_id", 151672),
            tts_eos=c.get("tts_eos_token_id", 151673), codec_pad=t["codec_pad_id"], codec_bos=t["codec_bos_id"],
            codec_eos=t["codec_eos_token_id"], codec_think=t["codec_think_id"], codec_nothink=t["codec_nothink_id"],
            codec_think_bos=t["codec_think_bos_id"], codec_think_eos=t["codec_think_eos_id"])

    @property
    def supported_languages(self) -> list[str]:
        """As the official wrapper: "auto" plus the languages that are not dialects."""
        return ["auto"] + sorted(k for k in self.languages if "dialect" not in k)

    @property
    def supports_instruct(self) -> bool:
        # the official wrapper drops instruct when `tts_model_size in "0b6"` (a substring test, kept as is)
        return self.model_size not in "0b6"


@dataclass(frozen=True)
class InputPlan:
    text_ids: tuple[int, ...]  # per prefill position
    codec: tuple[CodecSlot, ...]  # per prefill position
    trailing_text_ids: tuple[int, ...]  # decode step k adds P(trailing[k]), then P(tts_pad) once they run out
    tts_pad_id: int

    def __post_init__(self):
        if len(self.text_ids) != len(self.codec):
            raise ValueError(f"plan text ({len(self.text_ids)}) and codec ({len(self.codec)}) lengths differ")

    def __len__(self) -> int:
        return len(self.text_ids)

    def decode_text_id(self, step: int) -> int:
        """Text id added at decode step `step` (0 = the step that feeds frame 0 back)."""
        return self.trailing_text_ids[step] if step < len(self.trailing_text_ids) else self.tts_pad_id


@dataclass(frozen=True)
class TalkerGenerationRules:
    """The logits rules of the official talker `generate` (EOS, suppressed specials, min new tokens)."""

    eos_id: int
    suppressed_ids: tuple[int, ...]
    min_new_tokens: int = 2

    @classmethod
    def from_tables(cls, tables: PromptTables) -> "TalkerGenerationRules":
        start = tables.codec_vocab_size - 1024  # every special codec id: 2048..3071 for the released models
        return cls(tables.codec_eos,
                   tuple(i for i in range(start, tables.codec_vocab_size) if i != tables.codec_eos))


def _language_id(tables: PromptTables, language: str | None, speaker: str | None) -> int | None:
    lang = (language or "auto").lower()
    if lang not in tables.supported_languages:
        raise ValueError(f"unsupported language {language!r}; choose one of {tables.supported_languages}")
    lang_id = None if lang == "auto" else tables.languages[lang]
    dialect = tables.speaker_dialects.get(speaker) if speaker else False
    if dialect and lang in ("chinese", "auto"):  # the dialect speakers speak their dialect for Chinese text
        lang_id = tables.languages[dialect]
    return lang_id


def _check_ids(name: str, ids: Sequence[int] | None, allow_empty: bool = False) -> tuple[int, ...]:
    if ids is None or (len(ids) == 0 and not allow_empty):
        raise ValueError(f"{name} must be a non-empty sequence of token ids")
    out = tuple(int(i) for i in ids)
    if any(i < 0 for i in out):
        raise ValueError(f"{name} has negative token ids")
    return out


def _head(tables: PromptTables, instruct_ids: tuple[int, ...], lang_id: int | None,
          speaker: CodecSlot | None) -> tuple[list[int], list[CodecSlot]]:
    """Instruct block, role, then the codec prefix without its final codec_bos (shared by every mode)."""
    t = tables
    prefix = ([t.codec_nothink, t.codec_think_bos, t.codec_think_eos] if lang_id is None
              else [t.codec_think, t.codec_think_bos, lang_id, t.codec_think_eos])
    codec = [CodecSlot(CodecKind.TOKEN, i) for i in prefix]
    if speaker is not None:
        codec.append(speaker)
    codec.append(CodecSlot(CodecKind.TOKEN, t.codec_pad))  # the list then ends with codec_bos, placed by the tail
    text = list(instruct_ids) + list(ROLE_IDS) + [t.tts_pad] * (len(codec) - 1) + [t.tts_bos]
    return text, [NO_CODEC] * (len(instruct_ids) + len(ROLE_IDS)) + codec


def _plain_tail(tables: PromptTables, text_ids: tuple[int, ...], non_streaming: bool):
    t = tables
    if non_streaming:  # all text in the prefill over codec_pad, then tts_pad + codec_bos
        text = list(text_ids) + [t.tts_eos, t.tts_pad]
        codec = [CodecSlot(CodecKind.TOKEN, t.codec_pad)] * (len(text_ids) + 1) + [CodecSlot(CodecKind.TOKEN,
                                                                                             t.codec_bos)]
        return text, codec, (t.tts_pad,)
    # streaming text: the first text token rides with codec_bos, then one text token per frame, then tts_eos
    return [text_ids[0]], [CodecSlot(CodecKind.TOKEN, t.codec_bos)], text_ids[1:] + (t.tts_eos,)


def _icl_tail(tables: PromptTables, text_ids: tuple[int, ...], ref_text_ids: tuple[int, ...], num_ref_frames: int,
              non_streaming: bool):
    t = tables
    text = list(ref_text_ids + text_ids) + [t.tts_eos]
    codec = [CodecSlot(CodecKind.TOKEN, t.codec_bos)] + [CodecSlot(CodecKind.REF_FRAME, f)
                                                         for f in range(num_ref_frames)]
    if non_streaming:
        return (text + [t.tts_pad] * len(codec), [CodecSlot(CodecKind.TOKEN, t.codec_pad)] * len(text) + codec,
                (t.tts_pad,))
    if len(text) > len(codec):
        return text[:len(codec)], codec, tuple(text[len(codec):])
    return text + [t.tts_pad] * (len(codec) - len(text)), codec, (t.tts_pad,)


def plan_custom_voice(tables: PromptTables, text_ids: Sequence[int], speaker: str, language: str | None = "auto",
                      instruct_ids: Sequence[int] | None = None, non_streaming: bool = True) -> InputPlan:
    """CustomVoice: a built-in speaker, optional instruct (dropped on 0.6B as the official wrapper does)."""
    _require_kind(tables, "custom_voice")
    spk = (speaker or "").lower()
    if spk not in tables.speakers:
        raise ValueError(f"unknown speaker {speaker!r}; choose one of {sorted(tables.speakers)}")
    lang_id = _language_id(tables, language, spk)
    ins = _check_ids("instruct_ids", instruct_ids, allow_empty=True) if instruct_ids else ()
    if not tables.supports_instruct:
        ins = ()
    text_ids = _check_ids("text_ids", text_ids)
    text, codec = _head(tables, ins, lang_id, CodecSlot(CodecKind.TOKEN, tables.speakers[spk]))
    tail_text, tail_codec, trailing = _plain_tail(tables, text_ids, non_streaming)
    return InputPlan(tuple(text + tail_text), tuple(codec + tail_codec), trailing, tables.tts_pad)


def plan_voice_design(tables: PromptTables, text_ids: Sequence[int], instruct_ids: Sequence[int],
                      language: str | None = "auto", non_streaming: bool = True) -> InputPlan:
    """VoiceDesign: the voice comes from the instruct alone, no speaker slot."""
    _require_kind(tables, "voice_design")
    if not instruct_ids:
        raise ValueError("VoiceDesign needs instruct_ids (the tokens of instruct_text(description))")
    ins = _check_ids("instruct_ids", instruct_ids)
    lang_id = _language_id(tables, language, None)
    text_ids = _check_ids("text_ids", text_ids)
    text, codec = _head(tables, ins, lang_id, None)
    tail_text, tail_codec, trailing = _plain_tail(tables, text_ids, non_streaming)
    return InputPlan(tuple(text + tail_text), tuple(codec + tail_codec), trailing, tables.tts_pad)


def plan_voice_clone(tables: PromptTables, text_ids: Sequence[int], language: str | None = "auto", *,
                     x_vector_only: bool = False, ref_text_ids: Sequence[int] | None = None,
                     num_ref_frames: int = 0, non_streaming: bool = False) -> InputPlan:
    """Base: the x-vector in the speaker slot; ICL (default) also needs the reference codes and transcript.

    `non_streaming` defaults to False, the official default of `generate_voice_clone`."""
    _require_kind(tables, "base")
    lang_id = _language_id(tables, language, None)
    text_ids = _check_ids("text_ids", text_ids)
    text, codec = _head(tables, (), lang_id, CodecSlot(CodecKind.SPEAKER))
    if x_vector_only:
        tail_text, tail_codec, trailing = _plain_tail(tables, text_ids, non_streaming)
    else:
        if not ref_text_ids:
            raise ValueError("ICL voice clone needs ref_text_ids (the reference transcript); "
                             "or pass x_vector_only=True")
        if num_ref_frames < 1:
            raise ValueError(f"ICL voice clone needs the reference codes (num_ref_frames >= 1), got {num_ref_frames}")
        tail_text, tail_codec, trailing = _icl_tail(tables, text_ids, _check_ids("ref_text_ids", ref_text_ids),
                                                    num_ref_frames, non_streaming)
    return InputPlan(tuple(text + tail_text), tuple(codec + tail_codec), trailing, tables.tts_pad)


@dataclass(frozen=True)
class SpeechPrompt:
    """One request's prompt inputs, for `build_plan` (fields not used by the model's kind must be left unset)."""

    text_ids: tuple[int, ...]
    language: str = "auto"
    speaker: str | None = None  # CustomVoice
    instruct_ids: tuple[int, ...] = ()  # CustomVoice (1.7B) and VoiceDesign
    x_vector_only: bool = False  # Base
    ref_text_ids: tuple[int, ...] = ()  # Base ICL
    num_ref_frames: int = 0  # Base ICL
    non_streaming: bool | None = None  # None: the official default of the kind


def build_plan(tables: PromptTables, prompt: SpeechPrompt) -> InputPlan:
    """Dispatch on the checkpoint kind; raises ValueError for inputs the kind does not take."""
    kind = tables.model_type
    if kind == "custom_voice":
        _reject(prompt, kind, x_vector_only=False, ref_text_ids=(), num_ref_frames=0)
        ns = True if prompt.non_streaming is None else prompt.non_streaming
        return plan_custom_voice(tables, prompt.text_ids, prompt.speaker, prompt.language, prompt.instruct_ids, ns)
    if kind == "voice_design":
        _reject(prompt, kind, speaker=None, x_vector_only=False, ref_text_ids=(), num_ref_frames=0)
        ns = True if prompt.non_streaming is None else prompt.non_streaming
        return plan_voice_design(tables, prompt.text_ids, prompt.instruct_ids, prompt.language, ns)
    if kind == "base":
        _reject(prompt, kind, speaker=None, instruct_ids=())
        ns = False if prompt.non_streaming is None else prompt.non_streaming
        return plan_voice_clone(tables, prompt.text_ids, prompt.language, x_vector_only=prompt.x_vector_only,
                                ref_text_ids=prompt.ref_text_ids, num_ref_frames=prompt.num_ref_frames,
                                non_streaming=ns)
    raise ValueError(f"unknown tts_model_type {kind!r}; expected custom_voice, voice_design or base")


def _reject(prompt: SpeechPrompt, kind: str, **unset: Any) -> None:
    bad = [name for name, default in unset.items() if getattr(prompt, name) not in (default, None)]
    if bad:
        raise ValueError(f"{kind} models do not take {bad}")


def _require_kind(tables: PromptTables, kind: str) -> None:
    if tables.model_type != kind:
        raise ValueError(f"this checkpoint is {tables.model_type!r}; the {kind!r} prompt needs a {kind} model")
