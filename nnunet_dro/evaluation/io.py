"""Finding and reading segmentation files; geometry checks; nnU-Net summary.json input.

Files are matched by nnU-Net case identifier: the file name without its ending
(``BraTS19_001.nii.gz`` -> ``BraTS19_001``). NIfTI files are read with nibabel (one read,
integer labels kept as integers, a truncated file is an error), NRRD, MHA and GIPL with SimpleITK;
PNG/BMP/TIFF go through nnU-Net's own reader classes. Geometry follows SimpleITK's conventions
(numpy axis order z, y, x; LPS origin and direction) whatever the reader; a NIfTI's geometry is
SimpleITK's reading of its header (qform or sform as SimpleITK, and so nnU-Net, chooses).

>>> split_case_id("case_001.nii.gz")
('case_001', '.nii.gz')
>>> split_case_id("dataset.json") is None
True
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np
import SimpleITK as sitk

from nnunet_dro.errors import UserError

NIFTI_ENDINGS = (".nii.gz", ".nii")
SITK_ENDINGS = (".nrrd", ".mha", ".gipl")
NNUNET_READER_ENDINGS = (".png", ".bmp", ".tif", ".tiff")
SEGMENTATION_ENDINGS = NIFTI_ENDINGS + SITK_ENDINGS + NNUNET_READER_ENDINGS

# Geometry tolerance (mm for spacing/origin, unitless for direction cosines): resampling and
# file-format round trips change these in the 5th-6th digit, real mismatches are far larger.
SPACING_ORIGIN_ATOL = 1e-3
DIRECTION_ATOL = 1e-3


@dataclass(frozen=True)
class Geometry:
    """Image grid in numpy array axis order (SimpleITK's x, y, z reversed); spacing in mm.

    ``origin`` and ``direction`` are in SimpleITK order and ``None`` for formats without them.
    """

    shape: tuple[int, ...]
    spacing: tuple[float, ...]
    origin: tuple[float, ...] | None = None
    direction: tuple[float, ...] | None = None

    @property
    def diagonal_mm(self) -> float:
        """Length of the image's diagonal in mm: the worst value HD95 can take on this grid (over
        its real dimensions, as the surfaces: a one-slice 2D image's slice thickness is no part of it)."""
        return float(math.sqrt(sum((n * s) ** 2 for n, s in zip(self.shape, self.spacing) if n > 1)))


def split_case_id(filename: str) -> tuple[str, str] | None:
    """``(case identifier, ending)`` for a segmentation file name, ``None`` for other files."""
    lower = filename.lower()
    if filename.startswith("."):
        return None
    for ending in SEGMENTATION_ENDINGS:  # ".nii.gz" is tested before ".nii" (order matters)
        if lower.endswith(ending) and len(filename) > len(ending):
            return filename[: -len(ending)], filename[-len(ending):]
    return None


def list_segmentations(folder: str, what: str, file_ending: str | None = None) -> dict[str, str]:
    """Map case identifier -> path for the segmentation files in ``folder``.

    Other files (summary.json, plans, .npz/.pkl probabilities) are ignored. ``what`` names the
    folder in error messages (e.g. ``"reference folder"``).

    With ``file_ending`` (dataset.json's), every label file of the folder must have that ending: a
    folder holding some files of another ending (``.nii`` beside ``.nii.gz``) is a UserError naming
    them, never a smaller set of cases (3 gunzipped references of 30 used to vanish, exit 0,
    n = 27); nnU-Net's own evaluator stops there too.
    """
    if not os.path.exists(folder):
        raise UserError(f"{what} does not exist: {folder}")
    if not os.path.isdir(folder):
        raise UserError(f"{what} is not a folder: {folder}")
    cases: dict[str, str] = {}
    other_endings: list[str] = []
    for name in sorted(os.listdir(folder)):
        split = split_case_id(name)
        if split is None:
            continue
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if file_ending is not None and split[1].lower() != file_ending.lower():
            other_endings.append(name)
            continue
        case = split[0]
        if case in cases:
            raise UserError(f"{what} {folder}: case {case!r} has two files "
                            f"({os.path.basename(cases[case])}, {name})")
        cases[case] = path
    if not cases:
        endings = file_ending or ", ".join(SEGMENTATION_ENDINGS)
        raise UserError(f"{what} {folder} contains no segmentation files ({endings}){_seen(folder, file_ending)}")
    if other_endings:
        seen = " or ".join(sorted({split_case_id(name)[1].lower() for name in other_endings}))
        raise UserError(f"{what} {folder}: {len(other_endings)} of {len(other_endings) + len(cases)} label files end "
                        f"in {seen}, not in {file_ending} as the dataset.json of the references says (e.g. "
                        f"{other_endings[0]}); nnU-Net reads only {file_ending}: write every file as {file_ending}")
    return cases


def _seen(folder: str, file_ending: str | None) -> str:
    """What the folder holds instead, for the message: ``.nii`` predictions beside ``.nii.gz``
    references must not read as an empty folder."""
    names = [n for n in sorted(os.listdir(folder)) if not n.startswith(".")]
    if not names:
        return "; the folder is empty"
    endings: dict[str, int] = {}
    for name in names:
        split = split_case_id(name)
        if os.path.isdir(os.path.join(folder, name)):
            ending = "folder(s)"
        else:
            ending = split[1].lower() if split else (os.path.splitext(name)[1] or name)
        endings[ending] = endings.get(ending, 0) + 1
    seen = ", ".join(f"{count} {ending}" for ending, count in sorted(endings.items(), key=lambda kv: -kv[1]))
    hint = (f" (the dataset.json of the references says file_ending {file_ending}: predictions must be written "
            f"in that format)" if file_ending and any(e in SEGMENTATION_ENDINGS for e in endings) else "")
    return f"; it holds {seen}, e.g. {names[0]}{hint}"


def _as_integer_labels(array: np.ndarray, path: str) -> np.ndarray:
    """Label maps must hold non-negative integers; floats are accepted if they are whole numbers."""
    if array.dtype.kind == "b":
        return array.astype(np.uint8)
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or not np.array_equal(array, np.round(array)):
            raise UserError(f"{path}: not a label map (non-integer values)")
        low, high = (array.min(), array.max()) if array.size else (0, 0)
        dtype = np.uint8 if low >= 0 and high < 256 else np.int64
        array = array.astype(dtype)
    elif array.dtype.kind not in "iu":
        raise UserError(f"{path}: not a label map (pixel type {array.dtype})")
    if array.dtype.kind == "i" and array.size and array.min() < 0:
        raise UserError(f"{path}: negative label value {int(array.min())}")
    return array


def read_segmentation(path: str) -> tuple[np.ndarray, Geometry]:
    """Read one label map: ``(integer array in numpy axis order, Geometry)``.

    Unreadable or corrupt files raise UserError naming the file.
    """
    if path.lower().endswith(NIFTI_ENDINGS):
        return _read_nifti(path)
    if path.lower().endswith(SITK_ENDINGS):
        try:
            image = sitk.ReadImage(path)
        except RuntimeError as e:
            first = next((line.strip() for line in str(e).splitlines() if "ERROR" in line or "rror" in line),
                         str(e).strip().splitlines()[-1] if str(e).strip() else "unknown error")
            raise UserError(f"cannot read {path}: {first}") from None
        if image.GetNumberOfComponentsPerPixel() != 1:
            raise UserError(f"{path}: not a label map ({image.GetNumberOfComponentsPerPixel()} components per voxel)")
        array = sitk.GetArrayFromImage(image)
        geometry = Geometry(shape=tuple(array.shape), spacing=tuple(float(s) for s in image.GetSpacing()[::-1]),
                            origin=tuple(image.GetOrigin()), direction=tuple(image.GetDirection()))
        return _as_integer_labels(array, path), geometry
    return _read_with_nnunet_reader(path)


def _read_nifti(path: str) -> tuple[np.ndarray, Geometry]:
    """NIfTI through nibabel from the decompressed bytes: ``gzip`` checks the stream's length and
    CRC, so a truncated or corrupt ``.nii.gz`` is an error (SimpleITK silently zero-fills it).

    The array is transposed to SimpleITK's axis order (a view). Spacing, origin and direction are
    SimpleITK's own reading of the header (``ReadImageInformation``: no pixels read), the geometry
    nnU-Net itself uses: where qform and sform differ (e.g. sform_code 2), nibabel's affine is the
    sform and SimpleITK's the qform, and a valid nnU-Net prediction (written with SimpleITK's
    geometry) was refused as an "origin mismatch". nibabel's affine, converted from RAS to LPS, is
    used only for a header SimpleITK refuses.
    """
    import gzip

    import nibabel
    import nibabel.imageglobals

    from nnunet_dro.data.nifti import check_complete_nifti, nifti_layout, one_line

    try:
        with open(path, "rb") as f:
            data = f.read()
        if path.lower().endswith(".gz"):
            data = gzip.decompress(data)
        image_class = nibabel.Nifti2Image if data[:4] == (540).to_bytes(4, "little") or \
            data[:4] == (540).to_bytes(4, "big") else nibabel.Nifti1Image
        nifti_layout(data, path)  # not a NIfTI header at all: a clear error, no nibabel log lines
        with nibabel.imageglobals.LoggingOutputSuppressor():  # one line on the terminal per error
            image = image_class.from_bytes(data)
        array = np.asanyarray(image.dataobj)
    except UserError:
        raise
    except Exception as e:  # gzip, zlib and nibabel raise many types; all mean "not a readable NIfTI"
        check_complete_nifti(path)  # a truncated or corrupt file: says how many bytes are missing
        raise UserError(f"cannot read {path}: {one_line(e)}") from None
    while array.ndim > 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim > 3:
        raise UserError(f"{path}: not a label map ({array.ndim}D image of shape {array.shape})")
    ndim = array.ndim
    geometry = _sitk_geometry(path, array.T.shape)
    if geometry is not None:
        return _as_integer_labels(array.T, path), geometry
    zooms = [float(z) for z in image.header.get_zooms()[:ndim]]
    affine = image.affine
    rotation = affine[:3, :3] / np.where(np.linalg.norm(affine[:3, :3], axis=0) > 0,
                                         np.linalg.norm(affine[:3, :3], axis=0), 1)
    ras_to_lps = np.diag([-1.0, -1.0, 1.0])
    origin = ras_to_lps @ affine[:3, 3]
    direction = ras_to_lps @ rotation
    array = array.T  # (x, y, z) -> (z, y, x): C-contiguous view, SimpleITK's order
    geometry = Geometry(shape=tuple(array.shape), spacing=tuple(zooms[::-1]),
                        origin=tuple(float(v) for v in origin[:ndim]),
                        direction=tuple(float(v) for v in direction[:ndim, :ndim].ravel()))
    return _as_integer_labels(array, path), geometry


def _sitk_geometry(path: str, shape: tuple[int, ...]) -> Geometry | None:
    """The file's geometry as SimpleITK reads it (header only), for an array of ``shape`` (numpy
    order); None if SimpleITK cannot read the header."""
    reader = sitk.ImageFileReader()
    reader.SetFileName(path)
    try:
        reader.ReadImageInformation()
    except RuntimeError:
        return None
    ndim, dimension = len(shape), reader.GetDimension()
    if dimension < ndim:
        return None
    direction = np.asarray(reader.GetDirection(), float).reshape(dimension, dimension)[:ndim, :ndim]
    return Geometry(shape=tuple(shape), spacing=tuple(float(v) for v in reader.GetSpacing()[:ndim][::-1]),
                    origin=tuple(float(v) for v in reader.GetOrigin()[:ndim]),
                    direction=tuple(float(v) for v in direction.ravel()))


def _read_with_nnunet_reader(path: str) -> tuple[np.ndarray, Geometry]:
    # Imported here: only 2D/TIFF datasets need it.
    from nnunetv2.imageio.reader_writer_registry import determine_reader_writer_from_file_ending

    ending = split_case_id(os.path.basename(path))[1]
    try:
        reader = determine_reader_writer_from_file_ending(ending, path, allow_nonmatching_filename=True,
                                                          verbose=False)()
        array, properties = reader.read_seg(path)
    except Exception as e:  # nnU-Net's readers raise anything from RuntimeError to AssertionError
        message = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot read {path}: {message}") from None
    array = array[0]
    if array.ndim == 3 and array.shape[0] == 1:  # nnU-Net's 2D images are (1, x, y) with a dummy spacing
        array = array[0]
        spacing = tuple(float(s) for s in properties["spacing"][1:])
    else:
        spacing = tuple(float(s) for s in properties["spacing"])
    return _as_integer_labels(array, path), Geometry(shape=tuple(array.shape), spacing=spacing)


def check_same_geometry(case: str, reference: Geometry, prediction: Geometry, method: str) -> None:
    """Reference and prediction must share the grid; a mismatch raises UserError naming the case."""
    where = f"case {case!r} (method {method})"
    # Shape and spacing are printed in x, y, z order, as origin and direction are (SimpleITK's,
    # ITK-SNAP's and the NIfTI header's order): a (z, y, x) spacing beside an (x, y, z) origin
    # made a reader compare the wrong axes.
    axes = "(x, y, z)" if len(reference.shape) == 3 else "(x, y)" if len(reference.shape) == 2 else ""
    if reference.shape != prediction.shape:
        raise UserError(f"{where}: shape mismatch {axes}, reference {tuple(reference.shape[::-1])} vs prediction "
                        f"{tuple(prediction.shape[::-1])}")
    if not np.allclose(reference.spacing, prediction.spacing, rtol=0, atol=SPACING_ORIGIN_ATOL):
        raise UserError(f"{where}: spacing mismatch {axes}, reference {_fmt(reference.spacing[::-1])} "
                        f"vs prediction {_fmt(prediction.spacing[::-1])}")
    if reference.origin is not None and prediction.origin is not None and \
            not np.allclose(reference.origin, prediction.origin, rtol=0, atol=SPACING_ORIGIN_ATOL):
        raise UserError(f"{where}: origin mismatch {axes}, reference {_fmt(reference.origin)} "
                        f"vs prediction {_fmt(prediction.origin)}")
    if reference.direction is not None and prediction.direction is not None and \
            not np.allclose(reference.direction, prediction.direction, rtol=0, atol=DIRECTION_ATOL):
        raise UserError(f"{where}: direction mismatch, reference {_fmt(reference.direction)} "
                        f"vs prediction {_fmt(prediction.direction)}")


def _fmt(values) -> str:
    return "(" + ", ".join(f"{v:g}" for v in values) + ")"


@dataclass(frozen=True)
class SummaryCounts:
    """One region of one case in an nnU-Net summary.json: Dice as a fraction (NaN when both sides are
    empty, nnU-Net's convention) and voxel counts when present."""

    dice: float
    n_ref: float | None = None
    n_pred: float | None = None


def _region_key(key: str) -> frozenset[int]:
    # nnU-Net writes a label as "1" and a region as "(1, 2, 3)" (label_or_region_to_key).
    return frozenset(int(v) for v in key.replace("(", "").replace(")", "").split(",") if v.strip())


def load_nnunet_summary(path: str) -> dict[str, dict[frozenset[int], SummaryCounts]]:
    """Per-case Dice from a summary.json written by ``nnUNetv2_evaluate_folder`` or at the end of
    ``nnUNetv2_train`` (validation). Cases are named by their reference file's identifier."""
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read nnU-Net summary {path}: {e}") from None
    per_case = content.get("metric_per_case") if isinstance(content, dict) else None
    if not isinstance(per_case, list) or not per_case:
        raise UserError(f"{path}: not an nnU-Net summary.json (no 'metric_per_case' list)")
    result: dict[str, dict[frozenset[int], SummaryCounts]] = {}
    for i, entry in enumerate(per_case):
        try:
            file = entry.get("reference_file") or entry["prediction_file"]
            split = split_case_id(os.path.basename(file))
            case = split[0] if split else os.path.basename(file)
            regions = {}
            for key, metrics in entry["metrics"].items():
                dice = metrics["Dice"]
                regions[_region_key(key)] = SummaryCounts(
                    dice=float("nan") if dice is None else float(dice),
                    n_ref=metrics.get("n_ref"), n_pred=metrics.get("n_pred"))
        except (KeyError, TypeError, AttributeError, ValueError):
            raise UserError(f"{path}: malformed entry {i} in 'metric_per_case'") from None
        if case in result:
            raise UserError(f"{path}: case {case!r} appears twice")
        result[case] = regions
    return result
