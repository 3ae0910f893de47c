#!/usr/bin/env bash
# One command on a fresh CPU machine: install the environments and run the tests (GPU tests skip without CUDA).
#   bash scripts/test.sh [PYTEST ARGS]   on the oldest vLLM of the tested range (0.26.0), e.g. -m "not server";
#                                        VOXSERVE_VLLM=newest for the newest (0.32.0), VOXSERVE_VENV=DIR for your own
#   bash scripts/test.sh --range [ARGS]  the whole suite on the oldest, then RANGE_TESTS on the newest; fails when
#                                        either run fails (CI's command)
set -euo pipefail
cd "$(dirname "$0")/.."
# What the newest vLLM runs (about 10 minutes on 2 cores): the tests of the code that touches vLLM (the plugin, the
# hook checks, the scheduler and worker adapters) and the servers that go through its scheduler, runner and RPCs:
# the speech API, the serving-mode switches, failed requests, seeded sampling in a batch, clients leaving, text
# streamed in over the WebSocket (paused requests leave vLLM's running queue and return).
RANGE_TESTS=(tests/test_plugin.py tests/test_vllm_hooks.py tests/test_compat.py tests/scheduler/test_adapter.py
             tests/worker tests/entrypoints/test_speech_server.py tests/entrypoints/test_codec_mode_server.py
             tests/entrypoints/test_fault_isolation_server.py tests/entrypoints/test_seed_batch_invariance_server.py
             tests/entrypoints/test_disconnects_server.py tests/entrypoints/test_speech_socket_server.py)
eval "$(bash scripts/register_without_pip.sh "$PWD/.cache/entry-points")"  # this checkout, with its vLLM entry points
bash scripts/install_parity.sh > /dev/null  # the official qwen-tts 0.1.1 environment for the parity tests
# FAAD2 decodes the AAC responses in the tests, independently of the server's encoder (that test skips without it)
install_faad() {
  [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null || return 1
  apt-get install -y -qq faad > /dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq faad; } > /dev/null 2>&1
}
command -v faad > /dev/null || install_faad || echo "test.sh: FAAD2 (faad) not installed; the AAC decode test skips" >&2
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

run_on() {  # run_on oldest|newest PYTEST_ARGS...
  local venv
  venv=$(bash scripts/install.sh "$1")
  shift
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
}

if [ "${1:-}" != "--range" ]; then
  run_on "${VOXSERVE_VLLM:-oldest}" "$@"
  exit
fi
shift
if [ -n "${VOXSERVE_VENV:-}" ]; then
  echo "test.sh: --range builds its own two environments; unset VOXSERVE_VENV" >&2
  exit 2
fi
bash scripts/install.sh oldest > /dev/null  # both environments before either run: a failed build stops here
bash scripts/install.sh newest > /dev/null
oldest=0 newest=0
run_on oldest "$@" || oldest=$?
run_on newest "${RANGE_TESTS[@]}" "$@" || newest=$?
if [ "$oldest" != 0 ] || [ "$newest" != 0 ]; then
  echo "test.sh: pytest exit status $oldest on the oldest vLLM (whole suite), $newest on the newest (range tests)" >&2
  exit 1
fi
