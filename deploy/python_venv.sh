#!/usr/bin/env bash
# A virtual environment with a torch from PyPI and the `atoll` wheel built from this tree, as a
# user installs it (pip install .: pyproject.toml). The tests then run the Python suite in it too
# (python_pip.*: the wheel reinstalled from the tree first). Needs the build's Debian packages
# (ATOLL_SETUP=packages deploy/setup.sh).
#   deploy/python_venv.sh [VENV]    default build/venv; ATOLL_TORCH_VERSION (default 2.11.0, the
#                                   GPU machines' release) picks the torch
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$root/build/venv}"
torch_version="${ATOLL_TORCH_VERSION:-2.11.0}"
python="${ATOLL_VENV_PYTHON:-python3}"
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
# torch's CUDA build (it runs on the CPU), pytest, transformers (tests/python/test_transformers.py)
# and what builds the wheel without isolation (the tests rebuild it offline). torchtitan is not
# installed: its 0.3.0 needs a newer torch than 2.11 (tests/python/test_torchtitan.py says how it
# ran).
"$venv/bin/pip" install -q "torch==$torch_version" pytest transformers "scikit-build-core>=0.10" \
  "pybind11>=2.10" ninja
"$venv/bin/pip" install -q --no-build-isolation --no-deps --force-reinstall "$root"
"$venv/bin/python" -W ignore -c "import sys, atoll, torch
print(f'{sys.argv[1]}: atoll {atoll.__version__} on torch {torch.__version__}')" "$venv"
