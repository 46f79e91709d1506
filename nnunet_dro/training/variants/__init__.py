"""Trainer variants named the nnU-Net way (hyper-parameters in the class name), one class in one
file, attributes only. Adding one means adding one file here: this package finds every module in
its folder (as nnU-Net finds its own variants by scanning a folder), and from the class it holds
come the exported name of :mod:`nnunet_dro.training`, the ``-tr`` lookup through ``nnunet_dro
trainer-dir``, the ``<name>_CPUBudget`` twin and the benchmark arm (the name without
``nnUNetTrainer``); see docs/development.md.

| trainer                          | sampling            | beta | importance sampling | optimiser            |
|----------------------------------|---------------------|------|---------------------|----------------------|
| nnUNetTrainerDRO                 | hardness weighted   | 100  | on, clip [0.1, 10]  | SGD Nesterov 0.99    |
| nnUNetTrainerDRO_beta10          | hardness weighted   | 10   | on                  | SGD Nesterov 0.99    |
| nnUNetTrainerDRO_beta1000        | hardness weighted   | 1000 | on                  | SGD Nesterov 0.99    |
| nnUNetTrainerDRO_noIS            | hardness weighted   | 100  | off                 | SGD Nesterov 0.99    |
| nnUNetTrainerDRO_beta10_noIS     | hardness weighted   | 10   | off                 | SGD Nesterov 0.99    |
| nnUNetTrainerDRO_beta1000_noIS   | hardness weighted   | 1000 | off                 | SGD Nesterov 0.99    |
| nnUNetTrainerDRO_SGDnoMomentum   | hardness weighted   | 100  | on                  | SGD, no momentum     |
| nnUNetTrainer_SGDnoMomentum      | uniform (ERM)       | -    | -                   | SGD, no momentum     |

Scale-free DRO (``beta_t`` re-solved so that the drawing distribution keeps a perplexity of at
least ``f * n`` cases, ``beta_t <= 100``). Importance weights, where on, use the draw-time beta, are
1 at a case's first draw and are self-normalised. What each was measured to do is in
docs/evidence.md and the benchmark journal; the variants keep the settings they were measured with
(no probability cap unless ``cap5`` is in the name), so their names mean what those tables say:

The default samples uniformly (ERM) until every structure's pseudo-Dice is at least 0.2; every
variant below samples robustly from the first epoch, as the default did when they were measured:

| trainer                          | f (fraction of cases p stays spread over) | importance sampling | largest p |
|----------------------------------|-------------------------------------------|---------------------|-----------|
| nnUNetTrainerDROAdaptive         | 0.5 after uniform sampling until every structure's pseudo-Dice >= 0.2 | off | 5 / n |
| nnUNetTrainerDROAdaptive_fromStart | 0.5 from the first epoch (the default before its ERM phase) | off      | 5 / n     |
| nnUNetTrainerDROAdaptive_f25_noIS_cap5 | 0.25 (the capped default made stronger) | off            | 5 / n     |
| nnUNetTrainerDROAdaptive_noIS    | 0.5 (the default before held-out seeds)   | off                 | no cap    |
| nnUNetTrainerDROAdaptive_f25     | 0.25 (most robust)                        | on                  | no cap    |
| nnUNetTrainerDROAdaptive_f50     | 0.5                                       | on                  | no cap    |
| nnUNetTrainerDROAdaptive_f75     | 0.75                                      | on                  | no cap    |
| nnUNetTrainerDROAdaptive_f90     | 0.9 (mildest)                             | on                  | no cap    |
| nnUNetTrainerDROAdaptive_f25_noIS | 0.25                                     | off                 | no cap    |
| nnUNetTrainerDROAdaptive_noIS_smooth25 | 0.5, stale losses smoothed: L += 0.25 (l - L) | off      | no cap    |
| nnUNetTrainerDROAdaptive_f75_noIS | 0.75                                     | off                 | no cap    |
| nnUNetTrainerDROAdaptive_f90_noIS | 0.9 (the default of the 40-case benchmark) | off               | no cap    |
| nnUNetTrainerDROAdaptive_warm50  | 0.5 after uniform sampling (ERM) for the first half of the epochs | on | no cap |
| nnUNetTrainerDROAdaptive_warm50_noIS | 0.5 after the same uniform first half             | off         | no cap    |
| nnUNetTrainerDROAdaptive_noGuard | 0.5 from the first epoch, without the stability guard | off | 5 / n |
| nnUNetTrainerDROAdaptive_trim5   | the default, its hardest 5 % of cases drawn at the uniform rate (outlier trim, for dirty labels) | off | 5 / n |
| nnUNetTrainerDROAdaptive_kappa1  | the paper's rule of thumb instead: beta = 1 / std(L), <= 100 | off  | no cap    |

GI-LS (feature-map DRO with label smoothing, docs/methods.md): ``nnUNetTrainerDROLS_T1`` is
``nnUNetTrainerDROLS`` with one ascent step instead of six.

Every class inherits the constructor of its base unchanged: nnU-Net records the constructor's
arguments by name for checkpoints, so subclasses must not define ``__init__(*args, **kwargs)``.
"""
from __future__ import annotations

import importlib
import pkgutil

from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer


def _discover() -> dict[str, type]:
    """Import every module of this folder; each must define exactly the trainer class it is named
    after (a misnamed file is an error at import, not a trainer that ``-tr`` silently lacks)."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        cls = getattr(module, info.name, None)
        if not (isinstance(cls, type) and issubclass(cls, nnUNetTrainer)):
            raise ImportError(f"{module.__file__}: a variant file must define the nnU-Net trainer class "
                              f"{info.name!r} it is named after")
        found[info.name] = cls
    return found


#: every variant by name, in name order
VARIANTS: dict[str, type] = _discover()
globals().update(VARIANTS)
__all__ = ["VARIANTS", *VARIANTS]
