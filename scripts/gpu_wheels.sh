#!/usr/bin/env bash
# Build the wheel folder that a GPU machine without a package index needs to run
# scripts/gpu_check.py: this package and what it needs beyond what such a machine already has
# (torch, numpy, scipy, pandas, matplotlib, scikit-image, timm). Wheels for CPython 3.12 on
# manylinux x86_64 (override with PY_VERSION / PLATFORM); never torch.
#
#   bash scripts/gpu_wheels.sh [OUT]          # default OUT: gpu_wheels/ (git-ignored)
#
# SimpleITK's wheel alone is about 50 MB, and a device run carries at most 64 MiB with the
# repository: so the wheels travel as one file, gpu_wheels/wheels.tar.xz (about 47 MB; see the
# end of this script), plus this package's own wheel in gpu_wheels/package/. On the GPU machine
# they go into the Python that holds its torch (not a new venv: one made from a venv's Python with
# --system-site-packages sees the base interpreter's packages, not that venv's torch):
#   one run (carry gpu_wheels/wheels.tar.xz and gpu_wheels/package):
#     mkdir -p /tmp/w && tar -xJf gpu_wheels/wheels.tar.xz -C /tmp/w
#         && python3 -m pip install -q --no-index --no-deps /tmp/w/*.whl gpu_wheels/package/*.whl
#         && python3 scripts/gpu_check.py -o /tmp/gpu_check
#
# --no-deps on purpose: pip must not resolve (and so never replace) the machine's torch; the list
# below is the closure of nnunetv2's imports minus what the machine has (with a few small ones it
# probably has, e.g. typing-extensions and requests, which the install replaces harmlessly). It leaves out two of
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
rm -f "$OUT"/*.tar.gz
# One carried file: the wheels re-zipped without compression (pip installs them as they are: a
# wheel's RECORD hashes the files, not the archive) and the lot compressed with xz, which packs
# SimpleITK's 260 MB library into about 27 MB where the wheel's own zip compression needs 50 MB.
# So one device run carries everything (about 40 MB with the repository's 5 MB), and no second
# run has to catch the machine while it is still warm.
python3 - "$OUT" <<'PY'
import sys, zipfile
from pathlib import Path
stored = Path(sys.argv[1]) / "stored"
stored.mkdir()
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(stored / wheel.name, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info), compress_type=zipfile.ZIP_STORED)
PY
ls -l "$OUT"/*.whl | awk 'NR > 0 {printf "  %8.1f MB  %s\n", $5 / 1048576, $9}'
tar -C "$OUT/stored" -cf - . | xz -9 -T0 > "$OUT/wheels.tar.xz.part" && mv "$OUT/wheels.tar.xz.part" "$OUT/wheels.tar.xz"
rm -rf "$OUT/stored"
# this package, apart: it changes with every commit, the bundle above only with the pins
$PIP wheel --quiet --no-deps -w "$OUT/package" .
du -sb "$OUT"/*.whl | awk '{s += $1} END {printf "wheels: %.1f MB\n", s / 1048576}'
du -sb "$OUT/wheels.tar.xz" | awk '{printf "%s: %.1f MB (carry it and the folder package/)\n", $2, $1 / 1048576}'
echo "a device run carries at most 64 MiB with the repository ($(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked)"
