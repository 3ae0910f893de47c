"""Streaming text-to-speech for `vllm serve`: a vLLM plugin (`--plugin voxserve`) for speech language models.

vLLM keeps model loading, the KV cache, batching, the CLI, the server and its metrics; this package adds the rest,
one folder per part, lowest first:

    contract.py      what crosses a process boundary: request keys, the step report, RPC names, the audio rate
    scheduler/       the scheduling policy, pure (no vLLM, no torch): deadlines, slack, admission, codec batching;
                     its `adapter.py` and `text_adapter.py` subclass vLLM's scheduler in the engine core
    models/          the speech models as model programs (Qwen3-TTS: talker, code predictor, codec), torch only
    codec_lanes/     the codec's SM partitions and lanes (background and urgent), on the models' codec programs
    worker/          vLLM's worker side: the step's speech bookkeeping, the audio pipeline, the lanes' runners
    entrypoints/     the API server side: `POST /v1/audio/speech`, the WebSocket text stream, voices, /metrics
    plugin.py        the entry points vLLM loads in every process; `vllm_hooks.py` checks the vLLM hooks it needs
                     by feature, `compat.py` holds each patch of vLLM internals with its target and why

The import rules between these layers are checked by `tests/test_import_layers.py`.
"""
