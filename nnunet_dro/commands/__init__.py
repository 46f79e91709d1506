"""Sub-commands of the ``nnunet_dro`` CLI, one module each.

Every module in this package that defines ``register(subparsers)`` is a sub-command: it adds its
parser (nnU-Net's argparse style: short ``-d``/``-o`` flags for the common options) and sets
``func`` to a callable taking the parsed ``argparse.Namespace`` and returning an exit code.
Modules parse arguments and report; the work lives in the layers (sampling, training,
evaluation, data, workflows).
"""
