"""Stratified robustness evaluation of segmentation predictions (``nnunet_dro evaluate``).

Per case and region: Dice and volume similarity in percent, HD95 in mm; per subgroup: mean, std,
median, IQR and low percentiles (the tail is what robustness is about); paired comparisons
between methods. Imports nothing from :mod:`nnunet_dro.training` or :mod:`nnunet_dro.sampling`.

Modules: :mod:`~.regions` (presets, parsing), :mod:`~.io` (files, geometry),
:mod:`~.metrics` (confusion tables, Dice/VS/HD95), :mod:`~.groups` (subgroup table, binning),
:mod:`~.stats` (statistics, tests), :mod:`~.result` (``EvaluationResult``), :mod:`~.reports`
(writers), :mod:`~.workers` (process pool), :mod:`~.api` (``evaluate``). Imports go one way:
``api`` uses ``reports``, both use ``result``.
"""
__all__ = ["evaluate", "EvaluationResult"]


def __getattr__(name):
    # Lazy: worker processes import only the metrics module, not pandas and the report writers.
    if name in __all__:
        from nnunet_dro.evaluation import api
        return getattr(api, name)
    raise AttributeError(name)
