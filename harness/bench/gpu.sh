#!/usr/bin/env bash
# The GPU check in one command, from a checkout (docs/gpu.md): a virtual
# environment with a CUDA build of TensorFlow and this checkout, then
# `python -m harness.bench.gpu` (the GPU tests, the warm-run benchmark and
# the probes), which writes one results file.  Meant to end within 10
# minutes on a machine that downloads at a few hundred MB/s.
#
#   bash harness/bench/gpu.sh [--venv DIR] [--tensorflow SPEC] [--wheels DIR]
#                             [--no-install] [--dry-run] [-- ARGS...]
#
#   --venv DIR         the virtual environment to make or reuse (.venv-gpu)
#   --tensorflow SPEC  what pip installs first ('tensorflow[and-cuda]>=2.15,<2.22');
#                      name your own version to check it: 'tensorflow[and-cuda]==2.15.1'
#   --wheels DIR       install from the wheels in DIR only, nothing downloaded
#                      (a machine without internet access)
#   --no-install       use the environment as it is
#   --dry-run          print what would run, run nothing
#   ARGS               passed to python -m harness.bench.gpu (--out FILE, --budget S,
#                      --runs N, --skip-tests, --skip-bench)
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

venv=.venv-gpu
tensorflow='tensorflow[and-cuda]>=2.15,<2.22'
wheels=""
install=1
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --venv|--tensorflow|--wheels)
      [ $# -ge 2 ] && [ -n "$2" ] || { echo "gpu.sh: $1 needs a value" >&2; usage; }
      case "$1" in --venv) venv=$2 ;; --tensorflow) tensorflow=$2 ;; --wheels) wheels=$2 ;; esac
      shift 2 ;;
    --no-install) install=0; shift ;;
    --dry-run) dry=1; shift ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) echo "gpu.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
if [ -n "$wheels" ] && [ ! -d "$wheels" ]; then
  echo "gpu.sh: --wheels $wheels is not a directory" >&2; exit 2
fi

run() {
  echo "+ $*"
  [ "$dry" = 1 ] || "$@"
}

pip_args=(-q)
[ -z "$wheels" ] || pip_args+=(--no-index --find-links "$wheels")

if [ "$install" = 1 ]; then
  [ -x "$venv/bin/python" ] || run python3 -m venv "$venv"
  run "$venv/bin/python" -m pip install "${pip_args[@]}" "$tensorflow"
  run "$venv/bin/python" -m pip install "${pip_args[@]}" -e '.[test]'
  if [ "$dry" = 1 ]; then
    run "$venv/bin/python" -m pip install "${pip_args[@]}" '$(python -m harness keras2)'
  else
    run "$venv/bin/python" -m pip install "${pip_args[@]}" "$("$venv/bin/python" -m harness keras2)"
  fi
elif [ ! -x "$venv/bin/python" ] && [ "$dry" = 0 ]; then
  echo "gpu.sh: --no-install, but $venv has no python; leave out --no-install to make it" >&2
  exit 2
fi
run "$venv/bin/python" -m harness.bench.gpu "$@"
