"""Regions to evaluate: each region is a union of label values.

A region spec comes from ``-regions``:

- a preset name: ``feta``, ``brats``, ``brats-nnunet`` (see :data:`PRESETS`);
- a path to an nnU-Net ``dataset.json`` (its labels, or its regions for region-based datasets);
- an inline list ``"NAME=l1,l2;NAME=l3"``;
- nothing: the labels (or regions) of the nnU-Net dataset the reference folder belongs to (its
  ``dataset.json`` in the folder above ``labelsTr``/``labelsTs``), named as there; without such a
  dataset.json, every foreground label found in the reference folder (decided after reading).

A preset used on an nnU-Net dataset must fit that dataset's ``dataset.json`` (see
:func:`check_preset_fits_dataset`): ``feta`` on a dataset converted with ``--three-regions`` would
score labels that do not exist and call the cerebellum "white_matter".

The spec also says which label values are *declared*: a reference or prediction voxel with any
other value is an error (it usually means the wrong label convention or a corrupt file).

>>> spec = parse_regions("brats")
>>> [(r.name, r.labels) for r in spec.regions]
[('ET', (4,)), ('TC', (1, 4)), ('WT', (1, 2, 4))]
>>> sorted(spec.declared_labels)
[0, 1, 2, 4]
>>> [(r.name, r.labels) for r in parse_regions("WM=3;CSF=4").regions]
[('WM', (3,)), ('CSF', (4,))]
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

from nnunet_dro.errors import UserError


@dataclass(frozen=True)
class Region:
    """A named union of label values, e.g. ``Region("TC", (1, 4))``."""

    name: str
    labels: tuple[int, ...]


@dataclass(frozen=True)
class RegionSpec:
    """What ``-regions`` resolved to.

    ``regions`` is ``None`` for the default (every foreground label found in the references).
    ``declared_labels`` is ``None`` when the allowed values are decided from the data (default and
    inline specs: background, the labels named, and every value present in the references).
    ``ignore_label`` (from a dataset.json) marks reference voxels left out of every metric, as in
    nnU-Net. ``nsd_tolerance_mm`` is a preset's own NSD tolerance (None: the evaluation's default);
    it is a field, not a lookup by ``source``, so that it survives :func:`check_preset_fits_dataset`
    (which rewrites the source) and any other ``replace``.
    """

    source: str
    regions: tuple[Region, ...] | None = None
    declared_labels: frozenset[int] | None = None
    ignore_label: int | None = None
    file_ending: str | None = None
    extra_labels: frozenset[int] = field(default_factory=frozenset)
    nsd_tolerance_mm: float | None = None

    def as_json(self) -> dict:
        return {"source": self.source,
                "regions": None if self.regions is None else {r.name: list(r.labels) for r in self.regions},
                "declared_labels": None if self.declared_labels is None else sorted(self.declared_labels),
                "ignore_label": self.ignore_label, "nsd_tolerance_mm": self.nsd_tolerance_mm}


# FeTA labels: 1 external CSF, 2 grey matter, 3 white matter, 4 ventricles (intra-axial CSF),
# 5 cerebellum, 6 deep grey matter, 7 brainstem. The paper reports the three regions below.
# NSD tolerances: two voxels at the usual resolution (FeTA's 0.5 mm reconstructions, BraTS's 1 mm).
PRESETS: dict[str, RegionSpec] = {
    "feta": RegionSpec(
        source="preset feta",
        regions=(Region("white_matter", (3,)), Region("intra_axial_csf", (4,)), Region("cerebellum", (5,))),
        declared_labels=frozenset(range(8)), nsd_tolerance_mm=1.0),
    # Legacy BraTS labels: 1 necrosis / non-enhancing tumour, 2 oedema, 4 enhancing tumour.
    "brats": RegionSpec(
        source="preset brats",
        regions=(Region("ET", (4,)), Region("TC", (1, 4)), Region("WT", (1, 2, 4))),
        declared_labels=frozenset({0, 1, 2, 4}), nsd_tolerance_mm=2.0),
    # nnU-Net's conversion of BraTS (Dataset137): 1 oedema, 2 non-enhancing/necrosis, 3 enhancing.
    "brats-nnunet": RegionSpec(
        source="preset brats-nnunet",
        regions=(Region("ET", (3,)), Region("TC", (2, 3)), Region("WT", (1, 2, 3))),
        declared_labels=frozenset({0, 1, 2, 3}), nsd_tolerance_mm=2.0),
}


def _as_label_tuple(value, where: str) -> tuple[int, ...]:
    values = value if isinstance(value, (list, tuple)) else [value]
    try:
        labels = tuple(sorted({int(v) for v in values}))
    except (TypeError, ValueError):
        raise UserError(f"{where}: label values must be integers, got {value!r}") from None
    if any(v < 0 for v in labels):
        raise UserError(f"{where}: label values must be >= 0, got {value!r}")
    return labels


def regions_from_dataset_json(path: str) -> RegionSpec:
    """Regions of an nnU-Net dataset.json: its regions if region-based, else each foreground label.

    The ``background`` (0) and ``ignore`` entries are not regions; ``ignore`` voxels of the
    reference are left out of every metric, as nnU-Net does.
    """
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read dataset.json {path}: {e}") from None
    labels = content.get("labels") if isinstance(content, dict) else None
    if not isinstance(labels, dict) or not labels:
        raise UserError(f"{path}: no 'labels' dictionary, is this an nnU-Net dataset.json?")
    regions, declared, ignore = [], {0}, None
    for name, value in labels.items():
        label_tuple = _as_label_tuple(value, f"{path}: label {name!r}")
        declared.update(label_tuple)
        if name == "ignore":
            ignore = label_tuple[0]
        elif label_tuple != (0,):
            regions.append(Region(str(name), tuple(v for v in label_tuple if v != 0)))
    if not regions:
        raise UserError(f"{path}: no foreground labels")
    ending = content.get("file_ending")
    return RegionSpec(source=f"dataset.json {os.path.abspath(path)}", regions=tuple(regions),
                      declared_labels=frozenset(declared), ignore_label=ignore,
                      file_ending=ending if isinstance(ending, str) else None)


def parse_inline_regions(text: str) -> RegionSpec:
    """Parse ``"NAME=l1,l2;NAME=l3"``.

    >>> [(r.name, r.labels) for r in parse_inline_regions("TC=1,4; WT=1,2,4").regions]
    [('TC', (1, 4)), ('WT', (1, 2, 4))]
    """
    regions: list[Region] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, sep, values = part.partition("=")
        name = name.strip()
        if not sep or not name or not values.strip():
            raise UserError(f"malformed region {part!r} in -regions {text!r} (expected NAME=l1,l2;NAME=l3)")
        labels = _as_label_tuple([v for v in values.split(",") if v.strip()], f"-regions region {name!r}")
        if 0 in labels:
            raise UserError(f"-regions region {name!r}: background (0) cannot be part of a region")
        if any(r.name == name for r in regions):
            raise UserError(f"-regions: region name {name!r} given twice")
        regions.append(Region(name, labels))
    if not regions:
        raise UserError(f"-regions {text!r}: no region given")
    named = frozenset(v for r in regions for v in r.labels)
    return RegionSpec(source=f"inline {text}", regions=tuple(regions), extra_labels=named)


def parse_regions(spec: str | None) -> RegionSpec:
    """Resolve the ``-regions`` value (see the module docstring); bad values raise UserError."""
    if spec is None or spec == "":
        return RegionSpec(source="default: each foreground label found in the references")
    if spec in PRESETS:
        return PRESETS[spec]
    if "=" in spec:
        return parse_inline_regions(spec)
    if spec.endswith(".json") or os.path.isfile(spec):
        if not os.path.isfile(spec):
            raise UserError(f"-regions: dataset.json not found: {spec}")
        return regions_from_dataset_json(spec)
    raise UserError(f"unknown region preset {spec!r} (choose {', '.join(PRESETS)}, a dataset.json path "
                    f"or 'NAME=l1,l2;NAME=l3')")


def default_regions(labels: Iterable[int]) -> tuple[Region, ...]:
    """One region per foreground label, named by its value."""
    return tuple(Region(str(v), (int(v),)) for v in sorted(set(labels)) if v != 0)


DATASET_JSON = "dataset.json"


def dataset_json_beside(reference: str) -> str | None:
    """The ``dataset.json`` of the nnU-Net dataset holding the reference folder (the folder above
    ``labelsTr``/``labelsTs``), or ``None``."""
    path = os.path.join(os.path.dirname(os.path.abspath(reference)), DATASET_JSON)
    return path if os.path.isfile(path) else None


def _label_text(region: Region) -> str:
    return f"{region.name}={'+'.join(map(str, region.labels))}"


def _values_text(values) -> str:
    values = sorted(values)
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    return ",".join(map(str, values))


def _name_key(name: str) -> str:
    """Region names compared as a reader would: ``White-Matter`` and ``white_matter`` are one name."""
    return "".join(c for c in name.lower() if c.isalnum())


def preset_mismatches(preset: RegionSpec, dataset: RegionSpec, complete: bool = True) -> list[str]:
    """What a preset gets wrong about a dataset (empty if it fits).

    - a label value the preset scores that the dataset does not have;
    - a foreground label value of the dataset that the preset does not declare (its voxels would
      be an "unknown label" or silently belong to no region);
    - a region whose name the dataset gives to other label values (names compared without case and
      punctuation: ``White-Matter`` is ``white_matter``).

    ``complete=False`` (a list the user wrote, which may score a subset) skips the second check.

    >>> three = RegionSpec("d", (Region("white_matter", (1,)), Region("intra_axial_csf", (2,)),
    ...                         Region("cerebellum", (3,))), frozenset({0, 1, 2, 3}))
    >>> preset_mismatches(PRESETS["feta"], three)  # doctest: +NORMALIZE_WHITESPACE
    ['labels 4,5 are not in the dataset', 'names for other labels: white_matter is 1 there, 3 in the preset,
      intra_axial_csf is 2 there, 4 in the preset, cerebellum is 3 there, 5 in the preset']
    """
    problems = []
    named = {v for r in preset.regions for v in r.labels}
    present = set(dataset.declared_labels or ()) - {0} - ({dataset.ignore_label} if dataset.ignore_label is not None
                                                          else set())
    lacking = sorted(named - present)
    if lacking:
        problems.append(f"label{'s' if len(lacking) > 1 else ''} {_values_text(lacking)} "
                        f"{'are' if len(lacking) > 1 else 'is'} not in the dataset")
    uncovered = sorted(present - set(preset.declared_labels or named)) if complete else []
    if uncovered:
        problems.append(f"dataset label{'s' if len(uncovered) > 1 else ''} {_values_text(uncovered)} "
                        f"{'are' if len(uncovered) > 1 else 'is'} unknown to the preset")
    by_name = {_name_key(r.name): r.labels for r in dataset.regions or ()}
    renamed = [f"{r.name} is {'+'.join(map(str, by_name[_name_key(r.name)]))} there, "
               f"{'+'.join(map(str, r.labels))} in the preset"
               for r in preset.regions if _name_key(r.name) in by_name and by_name[_name_key(r.name)] != r.labels]
    if renamed:
        problems.append("names for other labels: " + ", ".join(renamed))
    return problems


def check_preset_fits_dataset(name: str, preset: RegionSpec, dataset: RegionSpec, dataset_json: str,
                              strict: bool = True, warn: Callable[[str], None] | None = None) -> RegionSpec:
    """The preset, with the dataset's ignore label and file ending, if it fits the dataset.

    A misfit (:func:`preset_mismatches`) is a UserError naming both label sets, or with
    ``strict=False`` a warning (``--allow-mismatch``) and the preset as it is.
    """
    complete = name in PRESETS
    problems = preset_mismatches(preset, dataset, complete=complete)
    if problems:
        ours = ", ".join(_label_text(r) for r in preset.regions)
        declared = f"; values {_values_text(preset.declared_labels)}" if preset.declared_labels else ""
        theirs = ", ".join(_label_text(r) for r in dataset.regions)
        what = "the preset" if complete else "the list"
        problems = [p.replace("in the preset", f"in {what}") for p in problems]
        text = (f"-regions {name} does not fit the dataset of the references: {what} has {ours}{declared}, "
                f"{dataset_json} has {theirs}: {'; '.join(problems)}")
        if strict:
            raise UserError(f"{text}. Leave -regions out to use the dataset's own labels "
                            f"(or pass --allow-mismatch to go on)")
        if warn is not None:
            warn(f"warning: {text}; going on with the preset (--allow-mismatch)")
        return preset
    return replace(preset, source=f"{preset.source} (checked against {os.path.abspath(dataset_json)})",
                   ignore_label=dataset.ignore_label if preset.ignore_label is None else preset.ignore_label,
                   file_ending=preset.file_ending or dataset.file_ending)


def resolve_regions(spec: str | RegionSpec | None, reference: str | None, strict: bool = True,
                    warn: Callable[[str], None] | None = None) -> RegionSpec:
    """``-regions`` in the light of the dataset the reference folder belongs to.

    With a ``dataset.json`` beside the reference folder (:func:`dataset_json_beside`), the default
    is that dataset's labels or regions, and a preset must fit it (:func:`check_preset_fits_dataset`).
    Region names are checked wherever they come from (a preset, an inline list, another
    dataset.json): a name the dataset gives to other label values is an error, so that
    ``-regions "cerebellum=4"`` cannot report the ventricles as cerebellum. Without a dataset.json
    (or for RegionSpec objects) as :func:`parse_regions`.
    """
    if isinstance(spec, RegionSpec):
        return spec
    dataset_json = dataset_json_beside(reference) if reference else None
    if dataset_json is None:
        return parse_regions(spec)
    dataset = regions_from_dataset_json(dataset_json)
    if not spec:
        return replace(dataset, source=f"default: {dataset.source} (the dataset of the reference folder)")
    given = PRESETS[spec] if spec in PRESETS else parse_regions(spec)
    return check_preset_fits_dataset(spec, given, dataset, dataset_json, strict, warn)
