"""Qwen3-TTS 12 Hz: config, prompt plans, talker + code predictor, sampling, reference loop, loader, maker.

Import the submodules directly (`prompt` is pure Python; the others need torch)."""
