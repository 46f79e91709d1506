"""What a wheel of nnunet_dro ships: the product, without the lab (setup.py ``LAB_PACKAGES``).

The wheel is built for real from a copy of the sources (about 3 s; a copy, so that a stale
``build/`` of the checkout cannot leak into it) and unpacked; the product then runs from the
unpacked wheel alone, as after ``pip install nnunet_dro-*.whl``: ``trainer-dir`` and the trainer
modules work, ``demo`` (the lab's benchmark pipeline) refuses in one line."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from nnunet_dro.cli import main

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "nnunet_dro"


def _copy_sources(source: Path) -> Path:
    """What a build reads: setup.py, README.md, pyproject.toml and nnunet_dro/."""
    source.mkdir()
    for name in ("setup.py", "README.md", "pyproject.toml"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(PACKAGE, source / "nnunet_dro", ignore=shutil.ignore_patterns("__pycache__"))
    return source


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory) -> Path:
    """The unpacked wheel of a copy of the sources."""
    root = tmp_path_factory.mktemp("wheel")
    source = _copy_sources(root / "source")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(root / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [wheel] = (root / "dist").glob("nnunet_dro-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root / "site")
    return root / "site"


def _run_from_wheel(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Python with the unpacked wheel and the dependencies' site-packages on its path, as after a
    wheel install: ``-S`` skips the ``.pth`` files, so the checkout's editable install (whose finder
    would find ``nnunet_dro.lab`` in the source folder) is not there."""
    dependencies = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *dependencies])}
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_an_editable_install_imports_the_lab_from_the_sources(tmp_path):
    """``pip install -e .`` (``make install``): setuptools maps the package ``nnunet_dro`` to the source
    folder, so the lab, left out of the packages list, still imports there."""
    source = _copy_sources(tmp_path / "source")
    done = subprocess.run([sys.executable, "-c", "from setuptools import build_meta; "
                           f"print(build_meta.build_editable({str(tmp_path / 'dist')!r}))"],
                          cwd=source, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(tmp_path / "dist" / done.stdout.split()[-1]) as archive:
        archive.extractall(tmp_path / "site")
    done = _run_from_wheel(tmp_path / "site", "-c", f"import site; site.addsitedir({str(tmp_path / 'site')!r}); "
                           "import nnunet_dro.lab as lab; print(lab.__file__)", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == source / "nnunet_dro" / "lab" / "__init__.py"


def test_the_wheel_holds_every_product_module_and_no_lab_module(wheel_site):
    shipped = {p.relative_to(wheel_site).as_posix() for p in (wheel_site / "nnunet_dro").rglob("*.py")}
    product = {p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*.py") if "lab" not in p.relative_to(PACKAGE).parts}
    assert not [name for name in shipped if name.startswith("nnunet_dro/lab/")]
    assert shipped == product


def test_the_product_runs_from_the_wheel_without_the_lab(wheel_site, tmp_path):
    done = _run_from_wheel(wheel_site, "-c", "import nnunet_dro, nnunet_dro.ext_trainers.nnunet_dro_trainers as t; "
                                             "print(nnunet_dro.__file__, len(t.__all__))", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    where, trainers = done.stdout.split()
    assert Path(where).is_relative_to(wheel_site) and int(trainers) > 10
    done = _run_from_wheel(wheel_site, "-m", "nnunet_dro", "trainer-dir", cwd=tmp_path)
    assert done.returncode == 0 and Path(done.stdout.strip()).is_relative_to(wheel_site), done.stderr


def test_demo_from_the_wheel_refuses_in_one_line(wheel_site, tmp_path):
    done = _run_from_wheel(wheel_site, "-m", "nnunet_dro", "demo", "--quick", "-o", str(tmp_path / "out"),
                           cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "source checkout" in done.stderr and "make demo" in done.stderr
    assert not (tmp_path / "out").exists()


def test_demo_refuses_before_importing_the_lab_when_it_is_missing(monkeypatch, capsys, tmp_path):
    """The same refusal in this process: the lab made unfindable, and any import of it an error."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "nnunet_dro.lab" else real_find_spec(name, *args, **kwargs)

    class NoLab:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "nnunet_dro.lab" or name.startswith("nnunet_dro.lab."):
                raise AssertionError(f"{name} imported although the lab is missing")
            return None

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(sys, "meta_path", [NoLab, *sys.meta_path])
    for name in [m for m in sys.modules if m == "nnunet_dro.lab" or m.startswith("nnunet_dro.lab.")]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["demo", "--quick", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nnunet_dro demo: error: ") and err.strip().count("\n") == 0 and "pip install -e ." in err
    assert not (tmp_path / "out").exists()
