"""Options shared by the sub-commands that evaluate (``evaluate``, ``ensemble``); no sub-command here.

One function per group of options, so both commands spell, explain and default them alike:

- :func:`add_reference_argument`: ``-ref``;
- :func:`add_group_arguments`: ``-groups``, ``--group-by``, ``--case-column``, ``--groups-partial`` (the
  subgroup table);
- :func:`add_scoring_arguments`: ``-regions``, ``--metrics``, ``--nsd-tolerance``, ``--percentiles``,
  ``--empty``, ``--strict`` / ``--allow-mismatch``;
- :func:`evaluation_options`: the :class:`~nnunet_dro.evaluation.options.EvaluationOptions` that
  these options give, the one object both commands hand to the evaluation.

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_reference_argument(parser, required=True); add_group_arguments(parser); add_scoring_arguments(parser)
>>> args = parser.parse_args(["-ref", "labelsTs", "-groups", "g.tsv", "--group-by", "condition",
...                           "--percentiles", "10"])
>>> options = evaluation_options(args, missing="worst")
>>> options.group_by, options.percentiles, options.metrics, options.missing, options.strict
(('condition',), (10.0,), ('dice',), 'worst', True)
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from nnunet_dro.commands.arg_types import percentile

if TYPE_CHECKING:
    from nnunet_dro.evaluation.options import EvaluationOptions

Container = argparse._ActionsContainer  # a parser or an argument group


def add_reference_argument(parser: Container, *, required: bool, when_left_out: str = "; enables evaluation") -> None:
    """``-ref GT_DIR``: optional for ``ensemble``, where it turns the evaluation on, and for
    ``evaluate`` when ``-pred`` names a trainer folder (``when_left_out`` says what then)."""
    parser.add_argument("-ref", type=str, required=required, default=None, metavar="GT_DIR",
                        help="folder with the reference segmentations" + ("" if required else when_left_out))


def add_group_arguments(parser: Container) -> None:
    """``-groups TABLE``, ``--group-by COL ...``, ``--case-column COL``, ``--groups-partial``."""
    parser.add_argument("-groups", type=str, default=None, metavar="TABLE",
                        help="subgroup table (.csv or .tsv), one row per case")
    parser.add_argument("--group-by", type=str, nargs="+", default=None, metavar="COL",
                        help="group table columns to stratify by, each on its own (default: every column but "
                             "numeric ones and split, each named in a note). Bin a "
                             "numeric column with COL:EDGES, e.g. gestational_age:19,25,30,35,41 gives [19,25), "
                             "[25,30), ... plus <19 and >=41")
    parser.add_argument("--case-column", type=str, default="case", metavar="COL",
                        help="column of the group table holding the case identifiers. Default: case")
    parser.add_argument("--groups-partial", action="store_true",
                        help="go on when some evaluated cases have no row in the group table: they form the group "
                             "'(not in table)' (with a warning). Default: an error with examples of both sides")


def add_scoring_arguments(parser: Container) -> None:
    """``-regions SPEC``, ``--metrics``, ``--percentiles``, ``--empty``, ``--strict`` / ``--allow-mismatch``."""
    parser.add_argument("-regions", type=str, default=None, metavar="SPEC",
                        help="feta | brats | brats-nnunet | PATH/dataset.json | \"NAME=l1,l2;NAME=l3\". "
                             "Default: the labels (or regions) of the dataset.json beside the reference folder "
                             "(an nnU-Net dataset's labelsTr/labelsTs), named as there; without one, each "
                             "foreground label found in the references. A preset must fit that dataset.json")
    parser.add_argument("--metrics", type=str, nargs="+", default=["dice"],
                        choices=["dice", "hd95", "vs", "nsd", "euler", "b0", "b1", "b2", "topology"],
                        help="metrics: dice (%%), hd95 (mm), vs (volume similarity, %%), nsd (normalised surface "
                             "Dice at --nsd-tolerance, %%), euler, b0, b1, b2 (topology errors: |Euler "
                             "characteristic| and |Betti number| differences; topology = all four). Dice, vs, nsd "
                             "are better high, hd95 and the topology errors better low. Default: dice")
    parser.add_argument("--nsd-tolerance", type=float, default=None, metavar="MM",
                        help="tolerance of nsd in mm. Default: 1 for -regions feta, 2 for brats and brats-nnunet, "
                             "2 otherwise")
    parser.add_argument("--percentiles", type=percentile, nargs="+", default=[25, 10, 5], metavar="Q",
                        help="percentiles to report (numpy linear interpolation). Default: 25 10 5")
    parser.add_argument("--empty", type=str, default="one", choices=["one", "nan"],
                        help="region empty in both reference and prediction: one = Dice 100 (BraTS convention, "
                             "default), nan = left out of the statistics (nnU-Net's convention)")
    strictness = parser.add_mutually_exclusive_group()
    strictness.add_argument("--strict", action="store_true",
                            help="the default, kept for scripts: a region whose labels occur in no reference "
                                 "file, or a preset that does not fit the dataset.json beside the references, "
                                 "is an error")
    strictness.add_argument("--allow-mismatch", action="store_true",
                            help="for experts: go on with a warning where --strict (the default) stops: a region "
                                 "whose labels occur in no reference file, a preset that does not fit the "
                                 "dataset.json beside the references")


def evaluation_options(args: argparse.Namespace, **command_options) -> EvaluationOptions:
    """The evaluation options that :func:`add_group_arguments` and :func:`add_scoring_arguments`
    give (not ``-ref``, which is positional in ``evaluate``), with a command's own
    (``command_options``: ``missing``, ``num_processes``, ...) in the same object."""
    # here, not at the top: building the parser must not import the evaluation (numpy, scipy)
    from nnunet_dro.evaluation.options import EvaluationOptions

    return EvaluationOptions(groups=args.groups, group_by=args.group_by, case_column=args.case_column,
                             groups_partial=args.groups_partial, regions=args.regions,
                             metrics=args.metrics, percentiles=args.percentiles, empty=args.empty,
                             strict=not args.allow_mismatch, nsd_tolerance=args.nsd_tolerance,
                             **command_options)
