"""Settings of the case-weighting schemes: one frozen dataclass per scheme, one to one with the
weighting classes of :mod:`nnunet_dro.weighting` (nothing here knows nnU-Net).

A trainer holds one of them as ``dro_settings``; the scheme is its type, and a field exists only
on the scheme it acts on, so a combination that one scheme would silently ignore (an ERM phase on
the fixed-beta scheme, say) cannot be written. Variants are ``dataclasses.replace`` of a base:

>>> from dataclasses import replace
>>> base = AdaptiveHardnessSettings(fraction=0.5, max_weight=5.0)
>>> replace(base, fraction=0.25).fraction, base.fraction
(0.25, 0.5)
>>> replace(base, fraction=2.0)
Traceback (most recent call last):
...
ValueError: AdaptiveHardnessSettings.fraction = 2.0: expected 0 < fraction <= 1
>>> type(AdaptiveHardnessSettings().build(4, shared=False)).__name__
'AdaptiveHardnessWeighting'
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar, Optional, Sequence, Tuple, Type, Union

from numpy.typing import ArrayLike

from nnunet_dro.weighting.base import CaseWeighting, ImportanceWeights
from nnunet_dro.weighting.error_set import ErrorSetWeighting
from nnunet_dro.weighting.groups import FixedWeighting, GroupBalancedWeighting, GroupDROWeighting
from nnunet_dro.weighting.hardness import AdaptiveHardnessWeighting, Chi2HardnessWeighting, HardnessWeighting
from nnunet_dro.weighting.reweighting import KLReweighting

#: The importance weights of the hardness schemes (already a frozen, validated dataclass).
ImportanceSettings = ImportanceWeights
#: L_init when ``init_loss`` is None: above any per-case value of nnU-Net's losses (Dice + CE), so
#: every case is drawn once early.
DEFAULT_INIT_LOSS = 100.0
#: The stability guard's default: a lost structure counts as recovered at this fraction of its best.
DEFAULT_GUARD_RECOVER = 0.5


def _fail(obj: object, name: str, expected: str) -> None:
    raise ValueError(f"{type(obj).__name__}.{name} = {getattr(obj, name)!r}: expected {expected}")


def _check_guard_fields(settings) -> None:
    """The stability guard's fields, shared by the schemes that have the default's ERM phase and guard."""
    for name in ("guard", "guard_escalate"):
        if not isinstance(getattr(settings, name), bool):
            _fail(settings, name, "True or False")
    recover = settings.guard_recover
    if isinstance(recover, bool) or not isinstance(recover, (int, float)) or not 0.0 < recover <= 1.0:
        _fail(settings, "guard_recover", "a fraction of the best pseudo-Dice in (0, 1]")


def _finite_positive(obj: object, name: str) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        _fail(obj, name, "a finite number > 0")


def _optional_int(obj: object, name: str) -> None:
    value = getattr(obj, name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        _fail(obj, name, "an integer or None")


def _seed(seed: Optional[int], rank: int) -> Optional[int]:
    """Rank r draws with seed + r (its own stream); None: fresh entropy."""
    return None if seed is None else int(seed) + int(rank)


@dataclass(frozen=True, kw_only=True)
class WeightingSettings:
    """What every scheme's settings have: ``seed`` of the draws (rank r uses seed + r; None: fresh
    entropy). ``scheme`` names the scheme (the ``'scheme'`` of a checkpoint's state) and
    ``weighting_class`` is the :class:`~nnunet_dro.weighting.CaseWeighting` it builds.

    >>> HardnessSettings().scheme, GroupDROSettings().weighting_class.__name__
    ('kl', 'GroupDROWeighting')
    """

    scheme: ClassVar[str] = ""
    weighting_class: ClassVar[Type[CaseWeighting]] = CaseWeighting
    #: whether the weighting is built from a table of the user's (case weights or groups)
    needs_table: ClassVar[bool] = False

    seed: Optional[int] = None

    def __post_init__(self) -> None:
        _optional_int(self, "seed")

    def as_dict(self) -> dict:
        """Plain values (for the checkpoint's record of what a run was trained with).

        >>> HardnessSettings(beta=10.0).as_dict()["beta"]
        10.0
        """
        out = {"settings": type(self).__name__}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = {g.name: getattr(value, g.name) for g in fields(value)} \
                if isinstance(value, ImportanceWeights) else value
        return out


@dataclass(frozen=True, kw_only=True)
class _StaleLossSettings(WeightingSettings):
    """Fields of the schemes that keep one stale loss per case and draw by it."""

    importance: ImportanceWeights = ImportanceWeights()
    warmup: bool = False
    loss_smoothing: float = 1.0
    init_loss: Optional[float] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.importance, ImportanceWeights):
            _fail(self, "importance", "an ImportanceSettings (ImportanceWeights)")
        if not isinstance(self.warmup, bool):
            _fail(self, "warmup", "True or False")
        if isinstance(self.loss_smoothing, bool) or not isinstance(self.loss_smoothing, (int, float)) \
                or not 0.0 < self.loss_smoothing <= 1.0:
            _fail(self, "loss_smoothing", "0 < loss_smoothing <= 1 (1: replace the stale loss)")
        if self.init_loss is not None:
            _finite_positive(self, "init_loss")

    def _common(self, rank: int, shared: bool) -> dict:
        init = DEFAULT_INIT_LOSS if self.init_loss is None else float(self.init_loss)
        return dict(init_loss=init, importance=self.importance, seed=_seed(self.seed, rank), shared=shared,
                    warmup=self.warmup, loss_smoothing=float(self.loss_smoothing))


@dataclass(frozen=True, kw_only=True)
class HardnessSettings(_StaleLossSettings):
    """Hardness weighted sampling with a fixed ``beta`` (Algorithm 1 of Fidon et al.):
    :class:`~nnunet_dro.weighting.HardnessWeighting`.

    >>> s = HardnessSettings(beta=10.0, importance=ImportanceSettings(enabled=False))
    >>> w = s.build(3, shared=False); (w.current_beta, w.importance.enabled); w.close()
    (10.0, False)
    """

    scheme: ClassVar[str] = "kl"
    weighting_class: ClassVar[Type[CaseWeighting]] = HardnessWeighting

    beta: float = 100.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite_positive(self, "beta")

    def build(self, num_cases: int, rank: int = 0, shared: bool = True) -> HardnessWeighting:
        """The weighting over ``num_cases`` cases, drawing with seed + ``rank``."""
        return HardnessWeighting(num_cases, beta=float(self.beta), **self._common(rank, shared))


@dataclass(frozen=True, kw_only=True)
class Chi2HardnessSettings(_StaleLossSettings):
    """Hardness weighted sampling for the Pearson chi-square DRO problem:
    :class:`~nnunet_dro.weighting.Chi2HardnessWeighting`.

    >>> Chi2HardnessSettings(beta=10.0, warmup=True).warmup
    True
    """

    scheme: ClassVar[str] = "chi2"
    weighting_class: ClassVar[Type[CaseWeighting]] = Chi2HardnessWeighting

    beta: float = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite_positive(self, "beta")

    def build(self, num_cases: int, rank: int = 0, shared: bool = True) -> Chi2HardnessWeighting:
        """The weighting over ``num_cases`` cases, drawing with seed + ``rank``."""
        return Chi2HardnessWeighting(num_cases, beta=float(self.beta), **self._common(rank, shared))


@dataclass(frozen=True, kw_only=True)
class AdaptiveHardnessSettings(_StaleLossSettings):
    """Scale-free hardness weighted sampling: :class:`~nnunet_dro.weighting.AdaptiveHardnessWeighting`.

    - ``fraction``, ``beta_max``: beta re-solved so that the perplexity of p stays >= fraction * n,
      beta <= beta_max; ``rule`` ``"spread"`` with ``kappa``: the paper's ``beta = kappa / std(L)``.
    - ``max_weight``: no case above ``max_weight / n`` of the probability (None: no cap).
    - ``uniform_until``: uniform sampling (ERM) for this fraction of the epochs.
    - ``uniform_until_learned``: uniform sampling until every structure's pseudo-Dice is at least
      this value (None: off; 0.0 is on). The trainer decides when; the weighting is held uniform.
    - ``trim_fraction``: the hardest ``ceil(fraction * n)`` cases are drawn at the uniform rate.
    - ``guard``, ``guard_recover``, ``guard_escalate``: the stability guard of the trainer
      (:mod:`nnunet_dro.training.guard`).

    >>> s = AdaptiveHardnessSettings(fraction=0.25, uniform_until_learned=0.2)
    >>> w = s.build(8, shared=False); (w.fraction, w.held_uniform); w.close()
    (0.25, True)
    """

    scheme: ClassVar[str] = "kl_adaptive"
    weighting_class: ClassVar[Type[CaseWeighting]] = AdaptiveHardnessWeighting

    fraction: float = 0.5
    beta_max: float = 100.0
    rule: str = "perplexity"
    kappa: float = 1.0
    max_weight: Optional[float] = None
    uniform_until: float = 0.0
    uniform_until_learned: Optional[float] = None
    trim_fraction: float = 0.0
    guard: bool = False
    guard_recover: float = DEFAULT_GUARD_RECOVER
    guard_escalate: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        num = (int, float)
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, num) or not 0.0 < self.fraction <= 1.0:
            _fail(self, "fraction", "0 < fraction <= 1")
        _finite_positive(self, "beta_max")
        if self.rule not in AdaptiveHardnessWeighting.RULES:
            _fail(self, "rule", f"one of {AdaptiveHardnessWeighting.RULES}")
        _finite_positive(self, "kappa")
        if self.max_weight is not None and (isinstance(self.max_weight, bool) or not isinstance(self.max_weight, num)
                                            or not (math.isfinite(self.max_weight) and self.max_weight >= 1.0)):
            _fail(self, "max_weight", "None or a finite number >= 1 (a multiple of the uniform probability 1 / n)")
        if isinstance(self.uniform_until, bool) or not isinstance(self.uniform_until, num) \
                or not 0.0 <= self.uniform_until <= 1.0:
            _fail(self, "uniform_until", "a fraction of the epochs in [0, 1]")
        if self.uniform_until_learned is not None and (
                isinstance(self.uniform_until_learned, bool) or not isinstance(self.uniform_until_learned, num)
                or not 0.0 <= self.uniform_until_learned <= 1.0):
            _fail(self, "uniform_until_learned", "None or a pseudo-Dice in [0, 1]")
        if isinstance(self.trim_fraction, bool) or not isinstance(self.trim_fraction, num) \
                or not 0.0 <= self.trim_fraction < 1.0:
            _fail(self, "trim_fraction", "0 <= trim_fraction < 1")
        _check_guard_fields(self)

    def build(self, num_cases: int, rank: int = 0, shared: bool = True) -> AdaptiveHardnessWeighting:
        """The weighting over ``num_cases`` cases, drawing with seed + ``rank`` (held uniform when
        ``uniform_until_learned`` is set, until the trainer releases it)."""
        common = self._common(rank, shared)
        return AdaptiveHardnessWeighting(num_cases, self, init_loss=common["init_loss"], seed=common["seed"],
                                         shared=shared)


# the weighting reads its settings from this class (its module cannot import this one)
AdaptiveHardnessWeighting.settings_class = AdaptiveHardnessSettings


@dataclass(frozen=True, kw_only=True)
class KLReweightSettings(WeightingSettings):
    """KL-DRO by multiplicative per-case weights over uniform draws (Sow et al.):
    :class:`~nnunet_dro.weighting.KLReweighting`. ``schedule``: ``(progress, r)`` pairs, the
    temperature ``r = 1 / beta`` from that fraction of training on; ``momentum`` of the running
    normaliser; ``clip``: ``(w_min, w_max)`` or None.

    >>> KLReweightSettings(schedule=((0.0, 1.0), (0.5, 0.1))).build(4).reweighter.schedule
    ((0.0, 1.0), (0.5, 0.1))
    """

    scheme: ClassVar[str] = "kl_reweight"
    weighting_class: ClassVar[Type[CaseWeighting]] = KLReweighting

    schedule: Tuple[Tuple[float, float], ...] = ((0.0, 1.0), (1 / 3, 0.1), (2 / 3, 0.03))
    momentum: float = 0.5
    clip: Optional[Tuple[float, float]] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            pairs = tuple((float(s), float(r)) for s, r in self.schedule)
        except (TypeError, ValueError):
            pairs = ()
        if not pairs or pairs[0][0] != 0.0 or any(not (math.isfinite(r) and r > 0) for _, r in pairs) \
                or any(b[0] <= a[0] for a, b in zip(pairs, pairs[1:])):
            _fail(self, "schedule", "(progress, r) pairs, the first at progress 0, progress increasing, r > 0")
        if isinstance(self.momentum, bool) or not isinstance(self.momentum, (int, float)) \
                or not 0.0 < self.momentum <= 1.0:
            _fail(self, "momentum", "0 < momentum <= 1")
        if self.clip is not None:
            try:
                lo, hi = (float(c) for c in self.clip)
            except (TypeError, ValueError):
                lo = hi = float("nan")
            if not (0 < lo <= hi and math.isfinite(hi)):
                _fail(self, "clip", "None or (w_min, w_max) with 0 < w_min <= w_max")

    def build(self, num_cases: int, rank: int = 0, shared: bool = True) -> KLReweighting:
        """The weighting over ``num_cases`` cases (uniform draws; ``shared`` is unused: no sampler)."""
        return KLReweighting(num_cases, schedule=self.schedule, momentum=float(self.momentum), clip=self.clip,
                             seed=_seed(self.seed, rank))


@dataclass(frozen=True, kw_only=True)
class FixedWeightSettings(WeightingSettings):
    """Draws proportional to the user's per-case weights (``case_weights.tsv``), step weights 1:
    :class:`~nnunet_dro.weighting.FixedWeighting`.

    >>> FixedWeightSettings(seed=0).build([1.0, 3.0], shared=False).case_weights.tolist()
    [1.0, 3.0]
    """

    scheme: ClassVar[str] = "case_weights"
    weighting_class: ClassVar[Type[CaseWeighting]] = FixedWeighting
    needs_table: ClassVar[bool] = True

    def build(self, weights: ArrayLike, rank: int = 0, shared: bool = True) -> FixedWeighting:
        """The weighting with these per-case weights (one per training case, in case order)."""
        return FixedWeighting(weights, seed=_seed(self.seed, rank), shared=shared)


@dataclass(frozen=True, kw_only=True)
class GroupBalancedSettings(WeightingSettings):
    """Each group drawn equally often (cases uniformly within a group), step weights 1:
    :class:`~nnunet_dro.weighting.GroupBalancedWeighting`. ``column``: the grouping column of
    ``subgroups.tsv`` (None: the first; the trainer's environment variable wins).

    >>> GroupBalancedSettings(column="centre").column
    'centre'
    """

    scheme: ClassVar[str] = "group_balanced"
    weighting_class: ClassVar[Type[CaseWeighting]] = GroupBalancedWeighting
    needs_table: ClassVar[bool] = True

    column: Optional[str] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.column is not None and not (isinstance(self.column, str) and self.column):
            _fail(self, "column", "None or a non-empty column name")

    def build(self, groups: Sequence[str], rank: int = 0, shared: bool = True) -> GroupBalancedWeighting:
        """The weighting over cases with these group labels (in case order)."""
        return GroupBalancedWeighting(groups, seed=_seed(self.seed, rank), shared=shared)


@dataclass(frozen=True, kw_only=True)
class GroupDROSettings(WeightingSettings):
    """Group-balanced draws and online group DRO weights with step size ``eta`` (Sagawa et al.):
    :class:`~nnunet_dro.weighting.GroupDROWeighting`.

    >>> w = GroupDROSettings(eta=0.1).build(["a", "b", "b"], shared=False); w.eta
    0.1
    """

    scheme: ClassVar[str] = "group_dro"
    weighting_class: ClassVar[Type[CaseWeighting]] = GroupDROWeighting
    needs_table: ClassVar[bool] = True

    column: Optional[str] = None
    eta: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.column is not None and not (isinstance(self.column, str) and self.column):
            _fail(self, "column", "None or a non-empty column name")
        _finite_positive(self, "eta")

    def build(self, groups: Sequence[str], rank: int = 0, shared: bool = True) -> GroupDROWeighting:
        """The weighting over cases with these group labels (in case order)."""
        return GroupDROWeighting(groups, eta=float(self.eta), seed=_seed(self.seed, rank), shared=shared)


@dataclass(frozen=True, kw_only=True)
class ErrorSetSettings(WeightingSettings):
    """JTT's error set inside one training: :class:`~nnunet_dro.weighting.error_set.ErrorSetWeighting`.

    - ``uniform_until_learned``: the ERM phase, as the default's (uniform sampling until every
      structure's pseudo-Dice is at least this value; the trainer decides when). At its end the
      error set is chosen: the hardest ``error_fraction`` of the training cases by stale loss,
      ties at the boundary included (as ``nnunet_dro jtt`` chooses it).
    - ``upweight``: from then on each error-set case is drawn this many times as often as the
      others (JTT's ``lambda_up``), fixed until the end.
    - ``refresh_at``: None (the set is chosen once), or a fraction of the epochs at which the set
      is chosen once more from the stale losses then (nothing happens if the ERM phase ends later).
    - ``guard``, ``guard_recover``, ``guard_escalate``: the default's stability guard; backed off,
      the sampling is uniform, and an escalation halves the upweight's distance to 1.

    >>> s = ErrorSetSettings()
    >>> (s.error_fraction, s.upweight, s.refresh_at), s.build(4, shared=False).held_uniform
    ((0.2, 5.0, None), True)
    >>> ErrorSetSettings(refresh_at=1.5)
    Traceback (most recent call last):
    ...
    ValueError: ErrorSetSettings.refresh_at = 1.5: expected None or a fraction of the epochs in (0, 1)
    """

    scheme: ClassVar[str] = "error_set"
    weighting_class: ClassVar[Type[CaseWeighting]] = ErrorSetWeighting

    error_fraction: float = 0.2
    upweight: float = 5.0
    uniform_until_learned: float = 0.2
    refresh_at: Optional[float] = None
    guard: bool = True
    guard_recover: float = DEFAULT_GUARD_RECOVER
    guard_escalate: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        num = (int, float)
        if isinstance(self.error_fraction, bool) or not isinstance(self.error_fraction, num) \
                or not 0.0 < self.error_fraction < 1.0:
            _fail(self, "error_fraction", "0 < error_fraction < 1 (the share of the cases in the error set)")
        if isinstance(self.upweight, bool) or not isinstance(self.upweight, num) \
                or not (math.isfinite(self.upweight) and self.upweight >= 1.0):
            _fail(self, "upweight", "a finite number >= 1 (1: every case drawn equally often)")
        if isinstance(self.uniform_until_learned, bool) or not isinstance(self.uniform_until_learned, num) \
                or not 0.0 <= self.uniform_until_learned <= 1.0:
            _fail(self, "uniform_until_learned", "a pseudo-Dice in [0, 1] (the end of the ERM phase)")
        if self.refresh_at is not None and (isinstance(self.refresh_at, bool) or not isinstance(self.refresh_at, num)
                                            or not 0.0 < self.refresh_at < 1.0):
            _fail(self, "refresh_at", "None or a fraction of the epochs in (0, 1)")
        _check_guard_fields(self)

    def build(self, num_cases: int, rank: int = 0, shared: bool = True) -> ErrorSetWeighting:
        """The weighting over ``num_cases`` cases, held uniform until the trainer fixes the set."""
        return ErrorSetWeighting(num_cases, upweight=float(self.upweight), seed=_seed(self.seed, rank), shared=shared)


#: every scheme's settings class, in the order of the weighting classes' table
SETTINGS_CLASSES: Tuple[Type[WeightingSettings], ...] = (
    HardnessSettings, AdaptiveHardnessSettings, Chi2HardnessSettings, KLReweightSettings, FixedWeightSettings,
    GroupBalancedSettings, GroupDROSettings, ErrorSetSettings)

AnySettings = Union[HardnessSettings, AdaptiveHardnessSettings, Chi2HardnessSettings, KLReweightSettings,
                    FixedWeightSettings, GroupBalancedSettings, GroupDROSettings, ErrorSetSettings]
