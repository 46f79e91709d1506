"""Running a converter through the real ``nnunet_dro`` CLI and damaging its input files."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"


def run_converter(command: str, *args, raw: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m nnunet_dro COMMAND ARGS`` with ``nnUNet_raw=raw`` (nothing else of nnU-Net set)."""
    env = {"PATH": "/usr/bin:/bin", "nnUNet_raw": str(raw), "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(PYTHON if PYTHON.exists() else sys.executable), "-m", "nnunet_dro", command,
                           *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)


def truncate(path: Path, keep: float = 0.6) -> Path:
    """Cut ``path`` to a fraction of its bytes, as an interrupted download or copy would."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def raw_with_other_dataset(root: Path) -> tuple[Path, list[str]]:
    """An ``nnUNet_raw`` that already holds another dataset; returns it and its listing."""
    raw = root / "nnUNet_raw"
    other = raw / "Dataset001_Other" / "imagesTr"
    other.mkdir(parents=True)
    (other / "x_0000.nii.gz").write_bytes(b"kept as it is")
    return raw, listing(raw)


def listing(folder: Path) -> list[str]:
    """Every path below ``folder`` (hidden ones too), relative and sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []
