"""``nnunet_dro cleanup-shm``: remove shared-memory blocks left by killed trainings.

A DRO training keeps its sampler state in a shared-memory block named
``nnunet_dro_<pid>_<random>`` (``/dev/shm`` on Linux). Normally it is removed when training ends,
or by Python's resource tracker when training is killed. When training *and* its resource tracker
are killed together (``kill -9`` of the process group, an out-of-memory kill of the job's cgroup,
a scheduler's cancel) the block stays. This command removes every such block whose owner
process no longer exists (a new training does the same at start-up)::

    nnunet_dro cleanup-shm            # remove orphans, print what was removed
    nnunet_dro cleanup-shm --dry-run  # only list them
"""
from __future__ import annotations

import argparse

from nnunet_dro.sampling.storage import SHM_DIR, orphan_segments, remove_orphan_segments


def run(args: argparse.Namespace) -> int:
    if not SHM_DIR.is_dir():
        print(f"{SHM_DIR} does not exist on this system: nothing to clean up")
        return 0
    found = orphan_segments() if args.dry_run else remove_orphan_segments()
    verb = "orphan" if args.dry_run else "removed"
    for path in found:
        print(f"{verb}: {path} ({path.stat().st_size if path.exists() else 0} bytes)" if args.dry_run
              else f"{verb}: {path}")
    print(f"{len(found)} orphan shared-memory block(s) of nnunet_dro {'found' if args.dry_run else 'removed'}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "cleanup-shm",
        help="remove shared-memory blocks of DRO samplers whose training process is gone",
        description="Remove the shared-memory blocks (nnunet_dro_<pid>_*, in /dev/shm) of DRO samplers whose "
                    "owner process no longer exists, e.g. after a process-group or out-of-memory kill. "
                    "Blocks of running trainings are never touched.")
    parser.add_argument("--dry-run", action="store_true", help="only list the orphan blocks")
    parser.set_defaults(func=run)
