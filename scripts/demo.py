"""The README's demo: serve the embedded tiny Qwen3-TTS checkpoint with `vllm serve ... --plugin voxserve` and
synthesize a WAV file through the OpenAI SDK, streaming."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.speech_server import SERVED_NAME, make_tiny_checkpoint, speech_server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="out/demo.wav")
    parser.add_argument("--text", default="Hello from vLLM. This audio was streamed as it was generated.")
    parser.add_argument("--voice", default="vivian")
    parser.add_argument("--seconds", type=float, default=4.0, help="length (random weights never stop by themselves)")
    args = parser.parse_args()
    import openai

    work = ROOT / "out"
    checkpoint = make_tiny_checkpoint(work / "qwen3-tts-tiny-customvoice")
    print(f"checkpoint: {checkpoint} (random weights, official Qwen3-TTS layout)")
    print("starting: vllm serve", checkpoint, "--plugin voxserve ...  (log: out/demo-serve.log)")
    with speech_server(checkpoint, spelling="flag", log_path=work / "demo-serve.log") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        tokens = int(args.seconds * 12.5) + 1  # 12.5 frames per second; N tokens give N-1 frames
        started = time.monotonic()
        first = None
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with client.audio.speech.with_streaming_response.create(
            model=SERVED_NAME, voice=args.voice, input=args.text, response_format="wav",
            extra_body={"stream": True, "max_new_tokens": tokens, "ignore_eos": True, "seed": 0},
        ) as response, open(out, "wb") as f:
            for chunk in response.iter_bytes():
                if first is None and f.tell() + len(chunk) > 44:
                    first = time.monotonic() - started
                f.write(chunk)
    import soundfile

    audio, rate = soundfile.read(out)
    print(f"wrote {out}: {len(audio) / rate:.2f} s at {rate} Hz; first audio after {first:.2f} s, "
          f"done after {time.monotonic() - started:.2f} s")


if __name__ == "__main__":
    main()
