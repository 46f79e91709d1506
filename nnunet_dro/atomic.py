"""Atomic output: a failed run never leaves a half-written file or folder behind."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from nnunet_dro.errors import UserError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    Works for files and folders. The rename is atomic on one file system (POSIX ``rename``).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_path(d / "x.txt") as tmp:
    ...     _ = tmp.write_text("hello")
    >>> (d / "x.txt").read_text()
    'hello'
    """
    path = Path(path)
    created = [p for p in path.absolute().parents if not p.exists()]  # removed again on failure
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()  # the caller creates a file or a folder there
    done = False
    try:
        yield tmp
        if path.is_dir() and tmp.is_dir():
            shutil.rmtree(path)
        os.replace(tmp, path)
        done = True
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
        if not done:
            for folder in created:  # innermost first
                with contextlib.suppress(OSError):
                    folder.rmdir()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def check_output_folder(path: str | os.PathLike, option: str = "-o") -> Path:
    """Check, before any work starts, that a folder can be created or updated at ``path``.

    UserError (one line, naming ``option`` and the path) if ``path`` exists and is not a folder,
    lies below a file, or is not writable (an existing folder, else its nearest existing
    ancestor). Writability is tested by creating and removing a hidden folder there, which also
    catches read-only file systems and superuser cases where permission bits say nothing.
    """
    path = Path(path)
    absolute = path.absolute()
    if path.exists():
        if not path.is_dir():
            raise UserError(f"{option} {path}: exists and is not a folder")
        _probe_writable(path, option, path)
        return path
    for ancestor in absolute.parents:  # exists() is False below a file: find the file
        if ancestor.exists():
            if not ancestor.is_dir():
                raise UserError(f"{option} {path}: {ancestor} is a file, not a folder")
            _probe_writable(ancestor, option, path)
            break
    return path


def _probe_writable(folder: Path, option: str, path: Path) -> None:
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".nnunet_dro_probe.", dir=folder))
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write in {folder} ({e.strerror or e})") from None


def can_replace_folder(path: str | os.PathLike) -> bool:
    """Whether :func:`replaced_folder` can swap the existing folder ``path``: its parent is
    writable and this process does not work inside it (its current directory would vanish)."""
    real = os.path.realpath(path)
    cwd = os.path.realpath(os.getcwd())
    if cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep):
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".nnunet_dro_probe.", dir=os.path.dirname(real)))
    except OSError:
        return False
    return True


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange_paths(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False where the system cannot do it (not Linux, old C library, a file system without
    support); the caller then falls back to two renames.
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(error, os.strerror(error), str(a), None, str(b))


def link_tree(source: Path, target: Path) -> None:
    """Put ``source`` (a file, link or folder tree) at ``target``: hard links, copies where the
    file system has none. The original stays untouched."""
    if source.is_dir() and not source.is_symlink():
        target.mkdir()
        for entry in source.iterdir():
            link_tree(entry, target / entry.name)
        shutil.copystat(source, target, follow_symlinks=False)
        return
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, target, follow_symlinks=False)


@contextlib.contextmanager
def replaced_folder(path: str | os.PathLike, keep: Callable[[str], bool]) -> Iterator[Path]:
    """Yield a new empty folder beside the existing folder ``path``; if the block succeeds, it
    takes the place of ``path`` in one atomic rename and the old folder is removed.

    Entries of the old folder for which ``keep(name)`` is true (and that the block did not
    write) are carried into the new folder first, as hard links (copies where impossible), so
    files of the user's that live beside a report survive. If the block fails, ``path`` is left
    exactly as it was. Where the system cannot exchange two folders atomically, two renames are
    used (a crash between them leaves the old folder under a hidden name beside ``path``).
    """
    path = Path(os.path.realpath(path))  # a symbolic link to a folder: replace the folder
    new = Path(tempfile.mkdtemp(prefix=f".{path.name}.new.", dir=path.parent))
    try:
        os.chmod(new, stat.S_IMODE(path.stat().st_mode))
        yield new
        written = {p.name for p in new.iterdir()}
        for entry in path.iterdir():
            if entry.name not in written and keep(entry.name):
                link_tree(entry, new / entry.name)
        if exchange_paths(new, path):
            shutil.rmtree(new, ignore_errors=True)  # now the old folder
            return
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
        os.replace(path, old)
        try:
            os.replace(new, path)
        except BaseException:
            os.replace(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if new.exists():
            shutil.rmtree(new, ignore_errors=True)
