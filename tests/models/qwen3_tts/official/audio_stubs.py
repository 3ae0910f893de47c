"""Lets the official `qwen_tts` import in its parity environment: only its 25 Hz tokenizer needs `sox`,
`onnxruntime` and `torchaudio`, and PyPI's torchaudio does not load beside a CPU torch (notes §6.1).

Import transformers before calling `install()`, as qwen_tts itself does, so transformers sees the real modules."""

import importlib.machinery
import sys
import types

NAMES = ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "sox", "onnxruntime")


def install() -> None:
    for name in NAMES:
        try:
            __import__(name)
        except Exception:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None)  # torch._dynamo calls find_spec on them
            sys.modules[name] = stub
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]
