"""Run nnU-Net's real command-line tools as subprocesses, the way a user would.

Why subprocesses and not nnU-Net's Python functions: its CLIs read the ``nnUNet_*`` environment
variables at import time and some of them spawn their own process pools; a fresh process per
step gives exactly what users get on the command line.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Callable, Mapping, Sequence

from nnunet_dro.errors import UserError

NNUNET_PATH_VARIABLES = ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")


def nnunet_executable(name: str) -> str:
    """Path of an nnU-Net console script (``nnUNetv2_train`` ...), next to this Python first."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise UserError(f"{name} not found: is nnunetv2 installed in this environment?")
    return found


def nnunet_environment(root: str | os.PathLike | None = None,
                       extra_trainer_dirs: Sequence[str | os.PathLike] = (),
                       overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for nnU-Net subprocesses.

    ``root``: put ``nnUNet_raw``/``_preprocessed``/``_results`` in ``root/`` (the demo does, so it
    never touches the user's own folders); otherwise the current variables must be set.
    ``extra_trainer_dirs`` are prepended to ``nnUNet_extTrainer``, after this package's trainers.
    """
    env = dict(os.environ)
    if root is not None:
        root = Path(root).resolve()
        for variable, folder in zip(NNUNET_PATH_VARIABLES,
                                    ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")):
            (root / folder).mkdir(parents=True, exist_ok=True)
            env[variable] = str(root / folder)
    else:
        unset = [v for v in NNUNET_PATH_VARIABLES if not env.get(v)]
        if unset:
            raise UserError(f"environment variable(s) {', '.join(unset)} not set (nnU-Net needs them)")
    from nnunet_dro.ext_trainers import TRAINER_DIR

    dirs = [str(Path(d).resolve()) for d in extra_trainer_dirs] + [TRAINER_DIR]
    existing = [d for d in env.get("nnUNet_extTrainer", "").split(os.pathsep) if d]
    env["nnUNet_extTrainer"] = os.pathsep.join(dict.fromkeys(dirs + existing))
    env.update(overrides or {})
    return env


def run_nnunet(tool: str, args: Sequence[str], env: Mapping[str, str],
               echo: Callable[[str], None] | None = print, log_file: str | os.PathLike | None = None,
               keep_lines: int = 30) -> None:
    """Run ``tool args`` (an nnU-Net console script); stream its output through ``echo``.

    On failure: the last output lines go to stderr (if they were not streamed already) and a
    one-line :class:`UserError` names the command and the log file.
    """
    command = [nnunet_executable(tool), *map(str, args)]
    tail: deque[str] = deque(maxlen=keep_lines)
    log = open(log_file, "a", encoding="utf-8") if log_file else None
    try:
        with subprocess.Popen(command, env=dict(env), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                if log:
                    log.write(line + "\n")
                if echo:
                    echo(line)
            code = proc.wait()
    finally:
        if log:
            log.close()
    if code != 0:
        if echo is None:
            print("\n".join(tail), file=sys.stderr)
        where = f" (full output in {log_file})" if log_file else ""
        raise UserError(f"{tool} {' '.join(command[1:])} failed with exit code {code}{where}")
