"""``nnunet_dro exclude-cases``: a new raw dataset without some training cases (after a label audit).

The left-out cases come from the table ``audit-labels -o`` writes (every flagged case, or those of
some flags) or from a list of case IDs; the new dataset gets its own ID, as nnU-Net wants
(:mod:`nnunet_dro.data.exclude_cases`). Example::

    nnunet_dro audit-labels -d 201 -o label_audit.tsv
    # open the flagged cases; delete the rows of the ones whose labels are right, then:
    nnunet_dro exclude-cases -d 201 -table label_audit.tsv --id 202 -n FeTAaudited
    nnUNetv2_plan_and_preprocess -d 202 -c 3d_fullres --verify_dataset_integrity
"""
from __future__ import annotations

import argparse
from pathlib import Path

from nnunet_dro.commands.dataset_options import add_dataset_arguments, add_input_dataset_argument


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "exclude-cases", help="write a new raw dataset without some training cases (e.g. audit-labels' flags)",
        description="Writes $nnUNet_raw/DatasetXXX_NAME (--id, -n): the raw dataset -d (or -i) without the training cases of "
                    "-table (a table with column 'case', such as audit-labels -o writes; with --flags only "
                    "the rows of those flags) or --cases. Images are hard-linked where possible, labels "
                    "copied; dataset.json's numTraining and subgroups.tsv follow; the test cases are kept; "
                    "excluded_cases.tsv in the new dataset lists what was left out and why.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_dataset_argument(parser, "the dataset to leave cases out of")
    parser.add_argument("-i", dest="dataset_dir", type=Path, default=None, metavar="DATASET_DIR",
                        help="or its folder, e.g. $nnUNet_raw/Dataset201_FeTA")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("-table", default=None, metavar="TABLE",
                        help="the cases to leave out: a .tsv/.csv with column 'case' (audit-labels -o)")
    source.add_argument("--cases", nargs="+", metavar="CASE",
                        help="the cases to leave out (comma lists and @file accepted)")
    parser.add_argument("--flags", default=None, metavar="FLAG[,FLAG]",
                        help="with -table: only its rows whose 'flag' is one of these, e.g. missing. "
                             "Default: every row")
    add_dataset_arguments(parser, default_name=None, name_default_text="the input's name + Excluded",
                          required=False)
    parser.set_defaults(func=run)


def _resolve_datasets(args: argparse.Namespace) -> None:
    """``-d`` (an ID or name under ``$nnUNet_raw``) or ``-i`` (a folder) is the input dataset; ``--id``
    the one written."""
    from nnunet_dro.commands.dataset_options import raw_dataset_folder
    from nnunet_dro.errors import UserError

    if args.dataset_dir is not None and args.dataset is not None:
        raise UserError(f"-d {args.dataset} and -i {args.dataset_dir} both name the input dataset; give one of them "
                        f"(the dataset written is --id)")
    if args.dataset_dir is None and args.dataset is None:
        raise UserError("give the input dataset: -d ID_OR_NAME (under $nnUNet_raw) or -i DATASET_DIR")
    if args.dataset_id is None:
        raise UserError("give the ID of the dataset to write: --id ID (and -n NAME)")
    if args.dataset_dir is None:
        args.dataset_dir = raw_dataset_folder(args.dataset)


def run(args: argparse.Namespace) -> int:
    from nnunet_dro.atomic import atomic_path
    from nnunet_dro.data.exclude_cases import EXCLUDED_FILENAME, write_dataset_without
    from nnunet_dro.data.raw_dataset import check_raw_dataset_output
    from nnunet_dro.data.splits import parse_case_list
    from nnunet_dro.errors import UserError

    _resolve_datasets(args)
    if args.flags is not None and args.table is None:
        raise UserError("--flags selects rows of -table; with --cases, list the cases themselves")
    reasons = (table_reasons(args.table, args.flags) if args.table is not None
               else {case: "listed with --cases" for case in parse_case_list(args.cases)})
    if not reasons:
        raise UserError(f"{args.table}: no case to leave out" + (f" with flags {args.flags}" if args.flags else ""))
    name = args.name or f"{args.dataset_dir.name.split('_', 1)[-1]}Excluded"
    target = check_raw_dataset_output(args.dataset_id, name, args.overwrite)
    if target.resolve() == args.dataset_dir.resolve():
        raise UserError(f"-d {args.dataset_id} -n {name}: that is the input dataset itself; choose a new ID")
    with atomic_path(target) as tmp:
        tmp.mkdir()
        left_out = write_dataset_without(args.dataset_dir, tmp, reasons)
    print(f"{target}: {len(left_out)} training case(s) left out ({', '.join(left_out)}); "
          f"listed in {EXCLUDED_FILENAME}")
    return 0


def table_reasons(path: str, flags: str | None) -> dict[str, str]:
    """Case -> why, from an audit-labels table (its flag and label joined per case) or any table with
    a ``case`` column; ``flags`` (comma-separated) keeps only the rows of those flags."""
    from nnunet_dro.data.exclude_cases import reasons_from_flags
    from nnunet_dro.errors import UserError
    from nnunet_dro.tables import read_case_table

    table = read_case_table(path, "case", what="case table", default_separator="\t", unique=False)
    if flags is not None:
        wanted = {flag.strip() for flag in flags.split(",") if flag.strip()}
        if "flag" not in table.columns:
            raise UserError(f"{path}: --flags needs a column 'flag' (columns: {', '.join(table.columns)})")
        unknown = wanted - set(table["flag"].dropna())
        if not wanted or unknown == wanted and len(table):
            raise UserError(f"--flags {flags}: none in {path} (flags there: "
                            f"{', '.join(sorted(set(table['flag'].dropna()))) or 'none'})")
        table = table[table["flag"].isin(wanted)]
    return reasons_from_flags(table, f"listed in {path}")
