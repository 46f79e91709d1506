"""Is a NIfTI file complete? Read it to the end and compare with what its header promises.

SimpleITK (ITK's NIfTI reader) fills a truncated ``.nii.gz`` or ``.nii`` with zeros and reports
success, so a half-downloaded file would become a silently damaged image or label map. Here the
whole file is read (a ``.nii.gz`` decompressed with zlib, which also checks the gzip CRC), and the
byte count is compared with the header: ``vox_offset + voxels * bytes per voxel``.

>>> import numpy as np, SimpleITK as sitk, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "x.nii.gz")
>>> voxels = np.random.default_rng(0).integers(0, 8, (8, 8, 8)).astype(np.uint8)
>>> sitk.WriteImage(sitk.GetImageFromArray(voxels), path)
>>> check_complete_nifti(path).voxels
512
>>> data = open(path, "rb").read(); _ = open(path, "wb").write(data[: len(data) // 2])
>>> check_complete_nifti(path)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
nnunet_dro.errors.UserError: ...x.nii.gz: truncated file: the gzip stream ends after ...
"""
from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from nnunet_dro.errors import UserError

NIFTI_ENDINGS = (".nii.gz", ".nii")
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20
_INCOMPLETE = "the download or copy is incomplete"


@dataclass(frozen=True)
class NiftiLayout:
    """What the header says the file holds."""

    shape: tuple[int, ...]
    dtype: str
    offset: int      # vox_offset: bytes before the voxel data
    itemsize: int

    @property
    def voxels(self) -> int:
        return math.prod(self.shape)

    @property
    def expected_bytes(self) -> int:
        return self.offset + self.voxels * self.itemsize

    def describe(self) -> str:
        return f"{self.offset}-byte header + {self.voxels} voxels of {self.dtype}"


def is_nifti(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(NIFTI_ENDINGS)


def nifti_layout(head: bytes, path: str | os.PathLike) -> NiftiLayout:
    """Parse the NIfTI-1 or NIfTI-2 header at the start of ``head`` (decompressed bytes).

    UserError naming ``path`` if it is too short or not a NIfTI header.
    """
    import nibabel

    if len(head) < 4:
        raise UserError(f"{path}: truncated file: {len(head)} bytes, not even a NIfTI header; "
                        f"{_INCOMPLETE}")
    size = int.from_bytes(head[:4], "little")
    if size not in (348, 540):
        size = int.from_bytes(head[:4], "big")
    if size not in (348, 540):
        raise UserError(f"{path}: cannot read image (not a NIfTI file: no NIfTI-1 or NIfTI-2 "
                        f"header)")
    if len(head) < size:
        raise UserError(f"{path}: truncated file: {len(head)} bytes, shorter than its "
                        f"{size}-byte NIfTI header; {_INCOMPLETE}")
    header_class = nibabel.Nifti1Header if size == 348 else nibabel.Nifti2Header
    try:
        header = header_class(head[:size], check=False)
        shape = tuple(int(n) for n in header.get_data_shape())
        dtype = header.get_data_dtype()
        offset = int(header.get_data_offset())
    except Exception as e:  # nibabel raises HeaderDataError, KeyError, ValueError for bad fields
        raise UserError(f"{path}: cannot read image (unreadable NIfTI header: {one_line(e)})") from None
    if any(n < 0 for n in shape):
        raise UserError(f"{path}: cannot read image (unreadable NIfTI header: negative dimension "
                        f"in {shape})")
    return NiftiLayout(shape, str(dtype), max(offset, size), int(dtype.itemsize))


def _gzip_chunks(stream: BinaryIO, path) -> Iterator[bytes]:
    """Decompressed chunks of a (possibly multi-member) gzip stream; UserError on corruption.

    A stream that ends before its end-of-stream marker raises ``EOFError`` after the last complete
    chunk, so the caller knows exactly how many bytes were there.
    """
    decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)
    while True:
        block = stream.read(_CHUNK)
        if not block:
            break
        while block:
            try:
                out = decompressor.decompress(block)
            except zlib.error as e:
                raise UserError(f"{path}: cannot read image (corrupt gzip data: {e}); the file "
                                f"is damaged or the download or copy is incomplete") from None
            if out:
                yield out
            if not decompressor.eof:
                break
            block = decompressor.unused_data
            if not block.strip(b"\0"):  # zero padding after the last member, as gzip allows
                return _drain(stream)
            decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)
    if not decompressor.eof:
        raise EOFError


def _drain(stream: BinaryIO) -> None:
    while True:
        block = stream.read(_CHUNK)
        if not block:
            return
        if block.strip(b"\0"):
            raise UserError(f"{stream.name}: cannot read image (corrupt gzip data: bytes after the "
                            f"end of the stream)")


def check_complete_nifti(path: str | os.PathLike) -> NiftiLayout:
    """Read all of ``path`` (``.nii`` or ``.nii.gz``) and check its size against the header.

    Returns the header's layout; raises a one-line UserError naming the file when the file is
    truncated, its gzip stream is corrupt, or it is not a NIfTI file. Memory use is one chunk.
    """
    try:
        with open(path, "rb") as stream:
            magic = stream.read(2)
            stream.seek(0)
            if magic == _GZIP_MAGIC:
                chunks = _gzip_chunks(stream, path)
            else:  # a plain .nii (or a .nii.gz that is not compressed, which ITK also reads)
                chunks = iter(lambda: stream.read(_CHUNK), b"")
            head, total, layout, truncated = b"", 0, None, False
            try:
                for chunk in chunks:
                    total += len(chunk)
                    if layout is None:
                        head += chunk
                        if len(head) >= 540 or len(head) >= 348 and head[:4] in (
                                (348).to_bytes(4, "little"), (348).to_bytes(4, "big")):
                            layout = nifti_layout(head, path)
                            head = b""
            except EOFError:
                truncated = True
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    if layout is None and truncated:
        raise UserError(f"{path}: truncated file: the gzip stream ends after {total} bytes, inside "
                        f"the NIfTI header; {_INCOMPLETE}")
    if layout is None:
        layout = nifti_layout(head, path)  # raises: too short for a header
    if total < layout.expected_bytes:
        where = "the gzip stream ends after" if truncated else "the file holds"
        raise UserError(f"{path}: truncated file: {where} {total} of the {layout.expected_bytes} "
                        f"bytes its header promises ({layout.describe()}); {_INCOMPLETE}")
    if truncated:  # enough bytes, but no end-of-stream marker
        raise UserError(f"{path}: truncated file: the gzip stream has no end; {_INCOMPLETE}")
    return layout


def one_line(error: BaseException) -> str:
    """An exception's message on one line (its lines joined), or its type name."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(lines) if lines else type(error).__name__
