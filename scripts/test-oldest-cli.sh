#!/usr/bin/env bash
# Run the CLI error-path tests against the OLDEST typer adaptcheck supports, in the ACTIVE venv,
# then put the newest typer back.
#
# Why: typer >= 0.29 vendors its own click (typer._click) while typer 0.12-0.28 use the click
# package; the CLI's one error path (adaptcheck/cli/app.py main) must map the usage errors of
# both to exit 2. The floor is read from pyproject.toml ("typer>=X"), so the two cannot drift.
# typer releases before 0.16 do not work with click 8.2 (changed parameter/metavar API), so
# the oldest typer is paired with the last click 8.1.
#
# Usage (from anywhere, with the test venv active; takes about a minute):
#   . .venv-test/bin/activate && bash scripts/test-oldest-cli.sh
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ -z "${VIRTUAL_ENV:-}" ]]; then
  echo "test-oldest-cli: activate a virtual environment first" >&2
  exit 2
fi

oldest=$(sed -n 's/^[[:space:]]*"typer>=\([0-9.]*\)".*/\1/p' pyproject.toml)
if [[ -z "$oldest" ]]; then
  echo "test-oldest-cli: no 'typer>=X' floor found in pyproject.toml" >&2
  exit 2
fi

restore() {
  # Always, also after a failure: the venv must end with the newest typer (and a click the
  # rest of the environment accepts), as install-test-deps.sh left it.
  echo "test-oldest-cli: restoring the newest typer" >&2
  python -m pip install -q -U typer click
}
trap restore EXIT

echo "test-oldest-cli: installing typer==$oldest with click<8.2" >&2
python -m pip install -q "typer==$oldest" "click>=8.0,<8.2"
python - <<'EOF'
import importlib.metadata as md
print(f"test-oldest-cli: typer {md.version('typer')}, click {md.version('click')}")
EOF

python -m pytest -q -p no:cacheprovider tests/cli/test_bad_inputs.py tests/test_safejson.py
