#!/usr/bin/env bash
# Build the wheel folder that a GPU machine without a package index needs to run
# scripts/gpu_check.py: this package and what it needs beyond what such a machine already has
# (torch, numpy, scipy, pandas, matplotlib, scikit-image, timm). Wheels for CPython 3.12 on
# manylinux x86_64 (override with PY_VERSION / PLATFORM); never torch.
#
#   bash scripts/gpu_wheels.sh [OUT]          # default OUT: gpu_wheels/ (git-ignored)
#
# SimpleITK's wheel alone is about 50 MB, and a device run carries at most 64 MiB with the
# repository: the folder is split into part1/ (SimpleITK) and part2/ (the rest, about 31 MB), for
# two back-to-back runs on the warm machine (it keeps /tmp for about 30 s between runs), in a venv
# that sees the machine's own torch:
#   run 1 (carry gpu_wheels/part1):
#     python -m venv --system-site-packages /tmp/gpuenv && /tmp/gpuenv/bin/python -m pip install
#         --no-index --no-deps gpu_wheels/part1/*.whl
#   run 2 (carry gpu_wheels/part2):
#     /tmp/gpuenv/bin/python -m pip install --no-index --no-deps gpu_wheels/part2/*.whl
#         && /tmp/gpuenv/bin/python scripts/gpu_check.py -o /tmp/gpu_check --time-limit 420
# Where one run may carry everything, install both parts at once.
#
# --no-deps on purpose: pip must not resolve (and so never replace) the machine's torch; the list
# below is the closure of nnunetv2's imports minus what the machine has (with a few small ones it
# probably has, e.g. typing-extensions and requests, which the venv below shadows harmlessly). It leaves out two of
# nnunetv2's declared requirements that nothing on the check's path imports: imagecodecs (TIFF
# codecs, 20+ MB) and dicom2nifti (DICOM conversion). Prints each wheel's size and the total.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu_wheels}
PY_VERSION=${PY_VERSION:-3.12}
PLATFORM=${PLATFORM:-manylinux_2_28_x86_64}
PIP=${PIP:-.venv/bin/python -m pip}
rm -rf "$OUT" && mkdir -p "$OUT"

# binary wheels, pinned to the versions this project is tested with where they exist for 3.12
BINARY="SimpleITK==2.5.* blosc2 numexpr msgpack ndindex connected-components-3d pydantic-core scikit-learn
threadpoolctl joblib"
# pure-Python ones (py3-none-any wheels, or built here from their sdists)
PURE="nnunetv2==2.8.1 dynamic-network-architectures==0.4.* acvl-utils==0.2.* batchgenerators==0.25.*
batchgeneratorsv2==0.3.* nibabel==5.* yacs einops graphviz seaborn future linecache2 traceback2 unittest2
argparse pydantic annotated-types typing-inspection cloudpickle rich markdown-it-py mdurl pygments
importlib-resources narwhals
typing-extensions six tqdm requests urllib3 certifi idna charset-normalizer httpx httpcore h11 anyio sniffio h2 hpack
hyperframe"

# shellcheck disable=SC2086
$PIP download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    --abi "cp${PY_VERSION/./}" --abi abi3 --abi none --platform "$PLATFORM" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any -d "$OUT" $BINARY
for spec in $PURE; do
  # a universal wheel if PyPI has one, else build one from the sdist (pure Python: any 3.x runs it)
  $PIP download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" -d "$OUT" "$spec" 2>/dev/null \
    || $PIP wheel --quiet --no-deps -w "$OUT" "$spec"
done
$PIP wheel --quiet --no-deps -w "$OUT" .   # this package
rm -f "$OUT"/*.tar.gz
mkdir -p "$OUT/part1" "$OUT/part2"
mv "$OUT"/simpleitk-*.whl "$OUT/part1/"
mv "$OUT"/*.whl "$OUT/part2/"
for part in part1 part2; do
  ls -l "$OUT/$part" | awk -v p="$part" 'NR > 1 {printf "  %8.1f MB  %s/%s\n", $5 / 1048576, p, $9}'
done
for part in part1 part2 .; do
  du -sb "$OUT/$part" | awk '{printf "%s: %.1f MB\n", $2, $1 / 1048576}'
done
echo "a device run carries at most 64 MiB with the repository ($(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked)"
