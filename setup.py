"""Installation of nnunet_dro.

Install torch (and torchvision) for your machine *before* this package, as you do for nnU-Net:
pip would otherwise pick a torch build on its own. ``make test`` / ``make demo`` do that for you.
"""
from setuptools import find_packages, setup

#: the lab (benchmark, CPU-budget twins, experiments) measures the product and is not shipped: a
#: wheel or ``pip install .`` has no ``nnunet_dro.lab``; ``pip install -e .`` (``make install``)
#: maps ``nnunet_dro`` to the source folder, so the lab imports from a checkout
LAB_PACKAGES = ["nnunet_dro.lab", "nnunet_dro.lab.*"]

setup(
    name="nnunet_dro",
    version="0.1.0",
    description="Distributionally robust training (hardness weighted sampling) and stratified "
                "robustness evaluation for nnU-Net v2",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["nnunet_dro", "nnunet_dro.*"], exclude=LAB_PACKAGES),
    include_package_data=True,
    install_requires=[
        # 2.8.x: we rely on its nnUNet_extTrainer lookup and on its trainer/loss internals.
        "nnunetv2>=2.8.1,<2.9",
        "torch>=2.1.2",  # a lower bound only: never replace the torch a GPU machine already has
        "SimpleITK",
        "nibabel",
        "batchgenerators",
        "numpy",
        "scipy",
        "pandas",
        "matplotlib",
        "scikit-learn",
    ],
    # pytest < 9.2: on 9.2 pytest-xdist 3.8's --dist loadgroup no longer groups (pytest-xdist issue
    # 1386): each file's tests are spread over the workers and a module-scoped fixture is built
    # once per worker (the shared benchmark run twice), and the /dev/shm files run side by side
    # selenium: tests/evaluation/test_eval_html_browser.py drives Debian's chromium through its chromedriver;
    # ruff: `make lint` (its rules in pyproject.toml)
    extras_require={"test": ["pytest>=8,<9.2", "pytest-timeout", "pytest-xdist", "hypothesis", "selenium>=4.10",
                             "ruff>=0.5"]},
    entry_points={"console_scripts": ["nnunet_dro = nnunet_dro.cli:main"]},
)
