"""Write nnU-Net v2 raw datasets: folder naming, atomic output, NIfTI files, dataset.json.

One writer serves every converter and synthetic generator, so the on-disk layout is defined once:

    $nnUNet_raw/DatasetXXX_Name/
        dataset.json          (nnunetv2's generate_dataset_json)
        subgroups.tsv         (see nnunet_dro.data.subgroups)
        imagesTr/CASE_0000.nii.gz ...   labelsTr/CASE.nii.gz
        imagesTs/CASE_0000.nii.gz ...   labelsTs/CASE.nii.gz   (held-out test cases)

nnU-Net ignores ``labelsTs``; the evaluation (``nnunet_dro evaluate -ref .../labelsTs``) uses it.
The whole dataset folder is built in a hidden temporary folder beside the target and renamed into
place at the end, so an interrupted conversion never leaves a half-written dataset behind.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import SimpleITK as sitk

from nnunet_dro.atomic import atomic_path, check_output_folder
from nnunet_dro.data.nifti import check_complete_nifti, is_nifti
from nnunet_dro.errors import UserError

FILE_ENDING = ".nii.gz"
TRAIN, TEST = "train", "test"
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")


def nnunet_raw_root() -> Path:
    """The folder named by ``$nnUNet_raw`` (created if missing); a UserError if it is unset."""
    value = os.environ.get("nnUNet_raw")
    if not value:
        raise UserError("environment variable nnUNet_raw is not set; export nnUNet_raw=/path/to/"
                        "nnUNet_raw (nnU-Net's raw data folder) and run again")
    root = Path(value)
    if root.exists() and not root.is_dir():
        raise UserError(f"nnUNet_raw={root} is not a folder")
    return root


def dataset_folder_name(dataset_id: int, name: str) -> str:
    """nnU-Net's folder name for a dataset.

    >>> dataset_folder_name(7, "FeTA")
    'Dataset007_FeTA'
    """
    if not 1 <= int(dataset_id) <= 999:
        raise UserError(f"dataset ID {dataset_id} is out of range; nnU-Net uses 1..999")
    if not _NAME_PATTERN.match(name):
        raise UserError(f"dataset name {name!r} must be letters, digits, '_' or '-' (no spaces)")
    return f"Dataset{int(dataset_id):03d}_{name}"


def _no_progress(message: str) -> None:
    """Where a :class:`DatasetTarget`'s progress notes go by default: nowhere."""


@dataclass(frozen=True)
class DatasetTarget:
    """The raw dataset a converter or generator writes: ``$nnUNet_raw/Dataset<dataset_id>_<name>``
    (``--id``, ``-n``), whether an existing folder of that ID and name is replaced (``--overwrite``)
    and where progress notes go (``progress``, one line each; default: nowhere). An ID outside
    1..999 or a name nnU-Net cannot use is a one-line UserError here, before any case is read.

    >>> DatasetTarget(201, "FeTA").folder_name
    'Dataset201_FeTA'
    >>> DatasetTarget(201, "Fe TA")
    Traceback (most recent call last):
    ...
    nnunet_dro.errors.UserError: dataset name 'Fe TA' must be letters, digits, '_' or '-' (no spaces)
    """

    dataset_id: int
    name: str
    overwrite: bool = False
    progress: Callable[[str], None] = _no_progress

    def __post_init__(self) -> None:
        dataset_folder_name(self.dataset_id, self.name)

    @property
    def folder_name(self) -> str:
        return dataset_folder_name(self.dataset_id, self.name)

    def check(self) -> Path:
        """:func:`check_raw_dataset_output` of this target: everything checkable before a case is read."""
        return check_raw_dataset_output(self.dataset_id, self.name, self.overwrite)

    def writer(self, num_channels: int) -> contextlib.AbstractContextManager[RawDatasetWriter]:
        """:func:`raw_dataset_output` of this target (the folder appears only on success)."""
        return raw_dataset_output(self.dataset_id, self.name, num_channels, self.overwrite)


def _check_id_free(dataset_id: int, folder_name: str) -> None:
    """nnU-Net resolves IDs across raw, preprocessed and results: one ID must mean one name."""
    for variable in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        base = os.environ.get(variable)
        if not base or not Path(base).is_dir():
            continue
        for other in Path(base).glob(f"Dataset{int(dataset_id):03d}_*"):
            if other.is_dir() and other.name != folder_name:
                raise UserError(f"dataset ID {dataset_id} is already used by {other}; "
                                f"choose another -d or remove that folder")


@dataclass(frozen=True)
class ImageInfo:
    """Header facts of an image file, read without loading the voxels."""

    path: Path
    size: tuple[int, ...]          # SimpleITK order (x, y, z)
    spacing: tuple[float, ...]
    origin: tuple[float, ...]
    direction: tuple[float, ...]
    components: int

    def same_grid(self, other: "ImageInfo", tolerance: float = 1e-3,
                  aspects: tuple[str, ...] = ("spacing", "origin", "direction")) -> str | None:
        """None if both images share a voxel grid, else a short description of the difference.

        The shape always counts; ``aspects`` chooses which of spacing, origin and direction do.
        """
        if self.size != other.size:
            return f"shape {other.size} differs from {self.size} of {self.path.name}"
        for what in aspects:
            mine, theirs = np.asarray(getattr(self, what)), np.asarray(getattr(other, what))
            scale = max(1.0, float(np.abs(mine).max(initial=0.0)))
            if not np.allclose(mine, theirs, atol=tolerance * scale, rtol=0):
                return f"{what} {tuple(np.round(theirs, 4))} differs from " \
                       f"{tuple(np.round(mine, 4))} of {self.path.name}"
        return None


def read_image_info(path: str | os.PathLike) -> ImageInfo:
    """Read the header of ``path`` (any format SimpleITK reads); UserError if unreadable."""
    path = Path(path)
    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    try:
        reader.ReadImageInformation()
    except RuntimeError as e:
        if is_nifti(path):
            check_complete_nifti(path)  # a clearer reason for a truncated or corrupt file
        raise UserError(f"{path}: cannot read image ({sitk_reason(e)})") from None
    if reader.GetDimension() != 3:
        raise UserError(f"{path}: expected a 3D image, found {reader.GetDimension()}D")
    return ImageInfo(path, tuple(reader.GetSize()), tuple(reader.GetSpacing()),
                     tuple(reader.GetOrigin()), tuple(reader.GetDirection()),
                     reader.GetNumberOfComponents())


def read_image(path: str | os.PathLike) -> sitk.Image:
    """Read an image with SimpleITK; UserError naming the file if it is unreadable.

    SimpleITK does not notice a truncated NIfTI file (it fills the missing voxels with zeros):
    check such files with :func:`check_complete_files` first.
    """
    try:
        return sitk.ReadImage(str(path))
    except RuntimeError as e:
        if is_nifti(path):
            check_complete_nifti(path)
        raise UserError(f"{path}: cannot read image ({sitk_reason(e)})") from None


def check_complete_files(paths: Sequence[str | os.PathLike],
                         progress: Callable[[str], None] = lambda message: None) -> None:
    """Read every NIfTI file in ``paths`` to its end and compare its size with its header.

    The converters call this before writing anything: a truncated or corrupt file (an
    interrupted download) is a UserError naming it, not a dataset with zero-filled voxels.
    """
    paths = [Path(p) for p in paths if is_nifti(p)]
    for number, path in enumerate(paths, start=1):
        if number == 1 or number % 50 == 0 or number == len(paths):
            progress(f"checking that every file is complete: {number}/{len(paths)}")
        check_complete_nifti(path)


def read_label_array(path: str | os.PathLike) -> tuple[sitk.Image, np.ndarray]:
    """Read a label map and return it with its integer voxel array (z, y, x).

    Float-typed label files are accepted if every value is an integer (some tools save label maps
    as float32); anything else is a UserError naming the file.
    """
    image = read_image(path)
    array = sitk.GetArrayFromImage(image)
    if not np.issubdtype(array.dtype, np.integer):
        if not np.all(np.isfinite(array)):
            raise UserError(f"{path}: label map contains NaN or inf values")
        rounded = np.rint(array)
        if not np.allclose(array, rounded, atol=1e-3):
            raise UserError(f"{path}: label map has non-integer values "
                            f"(e.g. {array[np.abs(array - rounded) > 1e-3].flat[0]:.4g})")
        array = rounded.astype(np.int32)
    return image, array


def check_label_values(path: str | os.PathLike, array: np.ndarray, allowed: Sequence[int]) -> None:
    """UserError naming the file if ``array`` holds a value outside ``allowed``."""
    flat = array.ravel()
    if flat.size and flat.min() >= 0 and flat.max() < 65536:
        present = np.flatnonzero(np.bincount(flat))  # much faster than np.unique on 256^3 maps
    else:
        present = np.unique(flat)
    unexpected = sorted(set(present.tolist()) - set(int(a) for a in allowed))
    if unexpected:
        raise UserError(f"{path}: unexpected label values {unexpected}; "
                        f"expected a subset of {sorted(int(a) for a in allowed)}")


def label_image_like(array: np.ndarray, reference: sitk.Image) -> sitk.Image:
    """A uint8 label image with ``reference``'s geometry (spacing, origin, direction)."""
    image = sitk.GetImageFromArray(np.asarray(array, dtype=np.uint8))
    image.CopyInformation(reference)
    return image


class RawDatasetWriter:
    """Collects the cases of one nnU-Net raw dataset inside ``folder`` and writes dataset.json.

    Use it through :func:`raw_dataset_output`, which makes the whole folder appear atomically.
    Case identifiers must be unique across train and test.
    """

    def __init__(self, folder: Path, num_channels: int, target: Path | None = None):
        self.folder = Path(folder)
        self.target = Path(target) if target is not None else self.folder  # final location
        self.num_channels = int(num_channels)
        self.splits: dict[str, str] = {}
        for sub in ("imagesTr", "labelsTr"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)

    def _images_dir(self, split: str) -> Path:
        return self.folder / ("imagesTr" if split == TRAIN else "imagesTs")

    def _labels_dir(self, split: str) -> Path:
        return self.folder / ("labelsTr" if split == TRAIN else "labelsTs")

    def _register(self, case: str, split: str) -> None:
        if split not in (TRAIN, TEST):
            raise ValueError(f"split must be {TRAIN!r} or {TEST!r}, got {split!r}")
        if self.splits.setdefault(case, split) != split:
            raise UserError(f"case {case} is assigned to both train and test")

    def image_path(self, case: str, channel: int, split: str) -> Path:
        """Where channel ``channel`` of ``case`` goes (nnU-Net's ``CASE_XXXX`` naming)."""
        self._register(case, split)
        directory = self._images_dir(split)
        directory.mkdir(exist_ok=True)
        return directory / f"{case}_{channel:04d}{FILE_ENDING}"

    def label_path(self, case: str, split: str) -> Path:
        self._register(case, split)
        directory = self._labels_dir(split)
        directory.mkdir(exist_ok=True)
        return directory / f"{case}{FILE_ENDING}"

    def write_image(self, case: str, channel: int, image: sitk.Image, split: str) -> Path:
        path = self.image_path(case, channel, split)
        sitk.WriteImage(image, str(path), useCompression=True)
        return path

    def copy_image(self, case: str, channel: int, source: Path, split: str) -> Path:
        """Copy a NIfTI file byte for byte when it is already ``.nii.gz``; re-encode otherwise."""
        path = self.image_path(case, channel, split)
        if str(source).endswith(FILE_ENDING) and _is_gzip(source):
            shutil.copyfile(source, path)
        else:
            sitk.WriteImage(read_image(source), str(path), useCompression=True)
        return path

    def write_label(self, case: str, label: sitk.Image, split: str) -> Path:
        path = self.label_path(case, split)
        sitk.WriteImage(sitk.Cast(label, sitk.sitkUInt8), str(path), useCompression=True)
        return path

    @property
    def training_cases(self) -> list[str]:
        return sorted(c for c, s in self.splits.items() if s == TRAIN)

    @property
    def test_cases(self) -> list[str]:
        return sorted(c for c, s in self.splits.items() if s == TEST)

    def finish(self, channel_names: Mapping[int, str], labels: Mapping[str, int | tuple[int, ...]],
               subgroups: pd.DataFrame, regions_class_order: Sequence[int] | None = None,
               **metadata) -> None:
        """Write dataset.json (via nnunetv2) and subgroups.tsv; check the table covers every case."""
        # Imported here: nnunetv2 is heavy and only needed when a dataset is actually written.
        from nnunetv2.dataset_conversion.generate_dataset_json import generate_dataset_json

        from nnunet_dro.data.subgroups import SUBGROUPS_FILENAME, write_subgroups

        if not self.training_cases:
            raise UserError("no training cases to write; nnU-Net needs at least one")
        table_cases = set(subgroups["case"])
        missing = sorted(set(self.splits) - table_cases)
        if missing:
            raise ValueError(f"subgroup table lacks cases {missing[:5]}")
        generate_dataset_json(str(self.folder), channel_names=dict(channel_names),
                              labels=dict(labels), num_training_cases=len(self.training_cases),
                              file_ending=FILE_ENDING,
                              regions_class_order=tuple(regions_class_order)
                              if regions_class_order is not None else None,
                              numTest=len(self.test_cases), converted_by="nnunet_dro",
                              **metadata)
        write_subgroups(self.folder / SUBGROUPS_FILENAME, subgroups)


@contextlib.contextmanager
def raw_dataset_output(dataset_id: int, name: str, num_channels: int,
                       overwrite: bool = False) -> Iterator[RawDatasetWriter]:
    """Yield a writer for ``$nnUNet_raw/DatasetXXX_Name``; the folder appears only on success.

    An existing dataset folder is replaced only with ``overwrite=True``; an ID already used by a
    dataset of another name (in raw, preprocessed or results) is a UserError, as nnU-Net could not
    tell the two apart.
    """
    target = check_raw_dataset_output(dataset_id, name, overwrite)
    with atomic_path(target) as tmp:
        yield RawDatasetWriter(tmp, num_channels, target=target)


def check_raw_dataset_output(dataset_id: int, name: str, overwrite: bool = False) -> Path:
    """Everything about the output a converter can check before it reads a case; returns
    ``$nnUNet_raw/DatasetXXX_Name``.

    ``nnUNet_raw`` set and a folder (or creatable), writable (tested by creating and removing a
    hidden folder, see :func:`nnunet_dro.atomic.check_output_folder`), the dataset ID free for
    this name, and no dataset folder of that name unless ``overwrite``. One-line UserError.
    """
    folder_name = dataset_folder_name(dataset_id, name)
    root = nnunet_raw_root()
    check_output_folder(root, "nnUNet_raw")
    target = root / folder_name
    _check_id_free(dataset_id, folder_name)
    if target.exists() and not overwrite:
        raise UserError(f"{target} already exists; pass --overwrite to replace it")
    return target


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def sitk_reason(error: BaseException) -> str:
    """The reason in a SimpleITK error, on one line.

    SimpleITK's messages start with a source location (``Exception thrown in SimpleITK
    ImageFileReader_Execute: /path/file.cxx:99:``); the reason is the ``ERROR:`` line and any
    lines after it.

    >>> sitk_reason(RuntimeError("Exception thrown in SimpleITK ReadImage: /src/x.cxx:99:\\n"
    ...                          "sitk::ERROR: Unable to determine ImageIO reader for 'a.nii'"))
    "Unable to determine ImageIO reader for 'a.nii'"
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if "ERROR:" in line:
            first = line.split("ERROR:", 1)[1].strip()
            return " ".join([first] + lines[index + 1:]) or type(error).__name__
    informative = [line for line in lines if not line.startswith("Exception thrown in SimpleITK")]
    return " ".join(informative or lines) or type(error).__name__
