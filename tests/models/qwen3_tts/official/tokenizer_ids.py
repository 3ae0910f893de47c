"""Official side of test_tokenizer.py: token ids from qwen-tts 0.1.1's Qwen3TTSProcessor (transformers 4.57.3).

Usage: tokenizer_ids.py CASES_JSON OUT_JSON. CASES_JSON: {"dirs": {name: checkpoint dir}, "texts": [...]}. For each
dir it loads the processor as Qwen3TTSModel.from_pretrained does (fix_mistral_regex=True) and writes, per text, the
ids of the official prompt strings (built by the wrapper's own _build_* methods) and of the bare text.
"""

import json
import sys

import transformers  # noqa: F401  (before the stubs, so transformers sees the real world)

import audio_stubs  # noqa: E402  (beside this script)

audio_stubs.install()

from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor  # noqa: E402
from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel  # noqa: E402


def ids(processor, text: str) -> list[int]:
    # As Qwen3TTSModel._tokenize_texts does it.
    return processor(text=text, return_tensors="pt", padding=True)["input_ids"][0].tolist()


def main(cases_path: str, out_path: str) -> None:
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    out = {}
    for name, path in cases["dirs"].items():
        processor = Qwen3TTSProcessor.from_pretrained(path, fix_mistral_regex=True)
        tok = processor.tokenizer
        rows = []
        for text in cases["texts"]:
            plain = tok(text)["input_ids"]
            rows.append(
                {
                    "text": text,
                    "plain": plain,
                    "decoded": tok.decode(plain),
                    "speech": ids(processor, Qwen3TTSModel._build_assistant_text(None, text)),
                    "ref": ids(processor, Qwen3TTSModel._build_ref_text(None, text)),
                    "instruct": ids(processor, Qwen3TTSModel._build_instruct_text(None, text)),
                }
            )
        out[name] = {
            "class": type(tok).__name__,
            "len": len(tok),
            "added": {t.content: i for i, t in tok.added_tokens_decoder.items()},
            "special": {t.content: t.special for t in tok.added_tokens_decoder.values()},
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
            "rows": rows,
        }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
