"""Hardness weighted sampling schemes: KL with a fixed beta (Algorithm 1), KL with a scale-free
beta, and Pearson chi-square DRO. All three draw from
:class:`~nnunet_dro.sampling.HardnessWeightedSampler` (sum tree, shared memory) and share the
importance-weight levers of :class:`~nnunet_dro.weighting.base.ImportanceWeights`.

Reference: Fidon et al., "Distributionally Robust Deep Learning using Hardness Weighted
Sampling", arXiv:2001.02658 (Algorithm 1); its earlier version "SGD with Hardness Weighted
Sampling for Distributionally Robust Deep Learning" (ICLR 2020 submission) for chi-square DRO
and the uniform warm-up pass.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from nnunet_dro.sampling.distributions import chi2_dro_objective, entropy, kl_dro_objective
from nnunet_dro.sampling.hardness import HardnessWeightedSampler, ImportanceClip
from nnunet_dro.sampling.temperature import (
    NO_TRIM,
    beta_from_spread,
    check_max_weight,
    loss_ceiling,
    outlier_trim,
    solve_beta_for_perplexity,
    solve_capped_beta_for_perplexity,
    trim_count,
)
from nnunet_dro.weighting.base import CaseWeighting, ImportanceWeights, check_batch, draw_betas

STATE_VERSION = 2
#: The beta of the adaptive scheme's uniform (ERM) phase, and the floor of every beta it solves:
#: never 0 (the sampler needs a positive beta), and so small that softmax(beta L) is uniform.
UNIFORM_BETA = 1e-12


class HardnessWeighting(CaseWeighting):
    """KL-DRO by hardness weighted sampling with a fixed beta (Algorithm 1 with the paper's
    defaults: beta 100, importance weights clipped to [0.1, 10]).

    Args:
        num_cases: number of training cases ``n``.
        beta: inverse temperature of ``p = softmax(beta * L)``.
        init_loss: ``L_init`` (scalar plus tiny tie-breaking noise, or a vector).
        importance: the importance-weight settings (:class:`ImportanceWeights`).
        seed: seed of the draws (other processes derive their own streams from it).
        shared: keep the state in shared memory (for data-loading worker processes).
        warmup: start with a uniform pass over the cases (weights 1 during it).
        loss_smoothing: ``s`` in ``(0, 1]``: ``L_i <- L_i + s (l_i - L_i)`` (1: the paper's
            replacement). A case's first fresh loss always replaces ``L_init``.

    >>> w = HardnessWeighting(4, beta=10.0, seed=0)
    >>> idx, beta = w.sample_with_beta(2)
    >>> weights = w.weights(idx, [0.3, 0.6], beta)
    >>> w.update(idx, [0.3, 0.6], beta)
    >>> bool(np.isclose(w.probabilities().sum(), 1.0))
    True
    >>> w.close()
    """

    scheme = "kl"
    divergence = "kl"

    def __init__(self, num_cases: int, beta: float = 100.0, init_loss: float | ArrayLike = 100.0,
                 importance: ImportanceWeights = ImportanceWeights(), seed: int | None = None,
                 shared: bool = False, warmup: bool = False, loss_smoothing: float = 1.0):
        super().__init__(num_cases)
        if not (0.0 < loss_smoothing <= 1.0):
            raise ValueError(f"loss_smoothing must lie in (0, 1], got {loss_smoothing}")
        self.importance = importance
        self.loss_smoothing = float(loss_smoothing)
        self.init_loss = init_loss
        self.sampler = HardnessWeightedSampler(
            num_cases, beta=self._initial_beta(beta), init_loss=init_loss,
            importance=ImportanceClip(importance.enabled, importance.clip), seed=seed, shared=shared, divergence=self.divergence, warmup=warmup)
        self.weight_scale = 1.0  # running mean of the raw weights (self-normalisation)

    def _initial_beta(self, beta: float) -> float:
        return float(beta)

    # -------------------------------------------------------------- draws
    def sample_with_beta(self, batch_size: int) -> tuple[NDArray[np.int64], float]:
        return self.sampler.sample_with_beta(batch_size)

    @property
    def current_beta(self) -> float:
        return self.sampler.beta

    @property
    def in_warmup(self) -> bool:
        return self.sampler.in_warmup

    # -------------------------------------------------------------- weights
    def _log_weights(self, idx: NDArray[np.int64], fresh: NDArray[np.float64],
                     beta: NDArray[np.float64]) -> NDArray[np.float64]:
        """Log of the unclipped importance ratio ``p_new / p_old`` (approximation of Algorithm 1)."""
        return self.sampler.log_importance_ratios(idx, fresh, beta)

    def _raw_weights(self, idx, fresh, draw_beta) -> tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.bool_]]:
        """(clipped weights before self-normalisation, clipped mask, counted mask)."""
        ones = np.ones(idx.shape, dtype=np.float64)
        none = np.zeros(idx.shape, dtype=bool)
        if not self.importance.enabled or self.in_warmup or idx.size == 0:
            return ones, none, none
        log_w = self._log_weights(idx, fresh, draw_betas(draw_beta, idx.size, self.current_beta))
        # a finite loss whose exponent overflows (+-inf) is clipped like any other; NaN is not a weight
        counted = np.isfinite(fresh) & ~np.isnan(log_w)
        if self.importance.first_draw_one:
            counted &= self.sampler.draw_counts[idx] > 0
        log_w = np.where(counted, log_w, 0.0)
        return self.importance.clip_log(log_w), self.importance.is_clipped(log_w) & counted, counted

    def weights(self, indices: ArrayLike, losses: ArrayLike, draw_beta: ArrayLike | None = None) -> NDArray[np.float64]:
        idx, fresh = check_batch(indices, losses, self.num_cases)
        raw, _, counted = self._raw_weights(idx, fresh, draw_beta)
        if self.importance.self_normalise:
            raw = np.where(counted, raw / self.weight_scale, raw)
        return raw

    def weights_before_loss(self, indices: ArrayLike, draw_beta: ArrayLike | None = None
                            ) -> NDArray[np.float64] | None:
        # importance weights off, or the uniform warm-up pass: every weight is 1 (see _raw_weights)
        if self.importance.enabled and not self.in_warmup:
            return None
        idx, _ = check_batch(indices, np.zeros(np.asarray(indices).size), self.num_cases)
        return np.ones(idx.shape, dtype=np.float64)

    # -------------------------------------------------------------- update
    def update(self, indices: ArrayLike, losses: ArrayLike, draw_beta: ArrayLike | None = None) -> None:
        idx, fresh = check_batch(indices, losses, self.num_cases)
        raw, clipped, counted = self._raw_weights(idx, fresh, draw_beta)
        self.counters.add(raw[counted], clipped[counted])
        if self.importance.self_normalise and counted.any():
            m = self.importance.momentum
            self.weight_scale = m * self.weight_scale + (1.0 - m) * float(raw[counted].mean())
        new = fresh
        if self.loss_smoothing < 1.0:
            stale = self.sampler.losses[idx]
            seen = self.sampler.draw_counts[idx] > 0
            new = np.where(seen, stale + self.loss_smoothing * (fresh - stale), fresh)
        self.sampler.update(idx, new)
        self._after_update()

    def _after_update(self) -> None:
        """Hook for schemes whose beta follows the losses."""

    # -------------------------------------------------------------- reports
    def probabilities(self) -> NDArray[np.float64]:
        return self.sampler.probabilities()

    @property
    def losses(self) -> NDArray[np.float64]:
        return self.sampler.losses

    @property
    def draw_counts(self) -> NDArray[np.int64]:
        return self.sampler.draw_counts

    @property
    def num_skipped(self) -> int:
        return self.sampler.num_skipped

    def robust_loss(self) -> float:
        return kl_dro_objective(self.losses, self.current_beta)

    def describe(self) -> str:
        iw = self.importance
        text = (f"hardness weighted sampling ({self.divergence}) with beta={self.current_beta:g}, importance weights "
                + (f"on (clipped to [{iw.clip[0]:g}, {iw.clip[1]:g}]"
                   + (", first draw 1" if iw.first_draw_one else "")
                   + (", self-normalised" if iw.self_normalise else "") + ")" if iw.enabled else "off"))
        if self.sampler.in_warmup:
            text += ", uniform warm-up pass first"
        if self.loss_smoothing < 1.0:
            text += f", stale losses smoothed by {self.loss_smoothing:g}"
        return text

    # -------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "scheme": self.scheme, "sampler": self.sampler.state_dict(),
                "weight_scale": self.weight_scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.weight_scale = float(state.get("weight_scale", 1.0))

    def close(self) -> None:
        self.sampler.close()


class AdaptiveHardnessWeighting(HardnessWeighting):
    """KL hardness weighted sampling whose beta follows the scale of the losses.

    ``beta_t`` is re-solved from the stale losses after every ``adapt_every`` updates (default:
    ``max(1, n // 256)``, so the O(n) solve costs O(256) per update on average whatever n is;
    draws stay O(log n)). Two rules:

    - ``rule="perplexity"`` (default): the largest ``beta <= beta_max`` whose ``softmax(beta L)``
      is spread over at least ``fraction * n`` cases (perplexity ``exp(H(p))``), i.e. the
      KL-constrained DRO problem with radius ``log(1 / fraction)``
      (:func:`~nnunet_dro.sampling.temperature.solve_beta_for_perplexity`);
    - ``rule="spread"``: ``beta = kappa / std(L)`` (the paper's rule of thumb), capped at ``beta_max``.

    ``max_weight`` (``c > 1``, default None: no cap): no case may take more than ``c / n`` of the
    probability. The perplexity bounds the spread of ``p`` but lets one case hold a large share
    (measured: 42 times uniform at ``f = 0.5`` and n = 177); with the cap, ``p`` is the maximiser over
    the KL ball intersected with the box ``q_i <= c / n``, ``softmax(beta * min(L, tau))``, and beta is
    the largest that keeps the *capped* distribution's perplexity at ``f * n``
    (:func:`~nnunet_dro.sampling.temperature.solve_capped_beta_for_perplexity`; with the spread
    rule, the ceiling ``tau`` is fitted to the rule's beta).

    Importance weights use the beta each case was drawn with (``draw_beta``) and the ceiling in
    force when they are computed.

    ``trim_fraction`` (default 0: none): an outlier trim in the spirit of DORO (Zhai et al., ICML
    2021, arXiv:2106.06142). The hardest ``ceil(trim_fraction * n)`` cases by stale loss leave the hardness
    distribution and are drawn at the uniform rate ``1 / n``; beta, the ceiling and the perplexity
    constraint are solved over the other cases, which share the rest
    (:func:`~nnunet_dro.sampling.temperature.outlier_trim`). Why: a case with a wrong label keeps
    the highest loss however well the network learns, and without the trim it is drawn at the cap
    for the rest of training. The price: a genuinely hard case that is among the hardest few is
    drawn as under ERM, not more.

    ``uniform_until`` (a fraction of training, via :meth:`set_progress`): before it, the constraint
    is ``fraction = 1`` (uniform sampling, weights 1: ERM, while the stale losses keep being
    refreshed); from it on, ``fraction``. Robust weighting then starts from a network that has
    learned the common anatomy, instead of steering the first iterations towards the hardest
    cases, which delays learning small structures at all.

    ``hold_uniform``: the same ERM phase, ended by an event instead of a date: the weighting stays
    uniform until :meth:`release` is called (the nnU-Net trainer calls it once every structure is
    learned, whenever that happens within the budget), and stays released. The flag is part of
    the state, so a resumed run continues in the phase it was in.

    :meth:`set_backoff`: the stability guard's lever (``nnunet_dro.training.guard``): uniform
    sampling while backed off, and the fraction ``f`` robust weighting returns with. Both are
    part of the state and of :meth:`epoch_stats` (``backed_off``, ``fraction``).

    >>> w = AdaptiveHardnessWeighting(8, fraction=0.5, init_loss=np.linspace(0.1, 0.8, 8))
    >>> round(float(np.exp(w.epoch_stats()["entropy"])) / 8, 6)
    0.5
    >>> w.close()
    """

    scheme = "kl_adaptive"
    RULES = ("perplexity", "spread")
    #: the frozen settings class (AdaptiveHardnessSettings); set by nnunet_dro.weighting.settings,
    #: which imports this module (the package imports both, so it is set before any use)
    settings_class: Any = None

    def __init__(self, num_cases: int, settings: Any = None, *,
                 init_loss: float | ArrayLike | None = None, seed: int | None = None, shared: bool = False,
                 hold_uniform: bool | None = None, adapt_every: int | None = None, **fields: Any):
        """``settings``: the frozen :class:`~nnunet_dro.weighting.settings.AdaptiveHardnessSettings`
        (None: its defaults). In plain Python its fields can be given as keywords instead, which
        replace those of ``settings`` and are validated as the settings are:
        ``AdaptiveHardnessWeighting(n, fraction=0.25, max_weight=5.0, seed=0)`` is
        ``AdaptiveHardnessWeighting(n, AdaptiveHardnessSettings(fraction=0.25, max_weight=5.0), seed=0)``.

        What is not a setting: ``init_loss`` (a scalar or one stale loss per case; None: the
        settings' ``init_loss``, else 100), ``seed`` (the stream of the draws, used as is; the
        settings' ``build`` derives it from their seed and the rank), ``shared`` (shared memory),
        ``hold_uniform`` (held uniform until :meth:`release`; None: whether the settings have
        ``uniform_until_learned``) and ``adapt_every`` (updates between two solves of beta; None:
        one per 256 cases). The guard's fields are the trainer's and are not read here.
        """
        settings = self.settings_class() if settings is None else settings
        if fields:
            settings = replace(settings, **fields)
        self.settings = settings
        fraction, beta_max, rule, kappa = settings.fraction, settings.beta_max, settings.rule, settings.kappa
        uniform_until, max_weight, trim_fraction = settings.uniform_until, settings.max_weight, settings.trim_fraction
        importance, warmup, loss_smoothing = settings.importance, settings.warmup, settings.loss_smoothing
        if init_loss is None:
            init_loss = 100.0 if settings.init_loss is None else float(settings.init_loss)
        if hold_uniform is None:
            hold_uniform = settings.uniform_until_learned is not None
        if rule not in self.RULES:
            raise ValueError(f"rule must be one of {self.RULES}, got {rule!r}")
        if not (0.0 < fraction <= 1.0):
            raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
        if not (math.isfinite(beta_max) and beta_max > 0):
            raise ValueError(f"beta_max must be a finite positive number, got {beta_max}")
        if not (0.0 <= uniform_until <= 1.0):
            raise ValueError(f"uniform_until must lie in [0, 1], got {uniform_until}")
        if max_weight is not None:
            check_max_weight(max_weight)
        self.max_weight = None if max_weight is None else float(max_weight)
        self.trim_fraction = float(trim_fraction)
        self.trimmed = trim_count(num_cases, self.trim_fraction)  # validates the fraction
        self.fraction, self.beta_max, self.rule, self.kappa = float(fraction), float(beta_max), rule, float(kappa)
        self.uniform_until = float(uniform_until)
        self.held_uniform = bool(hold_uniform)
        self.backed_off = False
        self.adapt_every = max(1, int(num_cases) // 256) if adapt_every is None else max(1, int(adapt_every))
        self._updates_since_solve = 0
        super().__init__(num_cases, beta=beta_max, init_loss=init_loss, importance=importance, seed=seed,
                         shared=shared, warmup=warmup, loss_smoothing=loss_smoothing)
        self.resolve_beta()

    @property
    def in_uniform_phase(self) -> bool:
        """True while training progress is below ``uniform_until`` or the weighting is held
        uniform (ERM phase)."""
        return self.held_uniform or self.backed_off or self.progress < self.uniform_until

    def set_backoff(self, backed_off: bool, fraction: float | None = None) -> bool:
        """Sample uniformly (``backed_off``) or not, and set the fraction ``f`` of robust weighting
        (None: unchanged); beta is re-solved if anything changed. Returns True if it did.

        >>> w = AdaptiveHardnessWeighting(4, init_loss=[0.1, 0.2, 0.3, 0.9])
        >>> w.set_backoff(True), round(float(w.probabilities().max()), 9)
        (True, 0.25)
        >>> w.set_backoff(False, 0.75), w.fraction, w.set_backoff(False, 0.75)
        (True, 0.75, False)
        >>> w.close()
        """
        fraction = self.fraction if fraction is None else float(fraction)
        if not (0.0 < fraction <= 1.0):
            raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
        changed = bool(backed_off) != self.backed_off or fraction != self.fraction
        if changed:
            self.backed_off, self.fraction = bool(backed_off), fraction
            self.resolve_beta()
        return changed

    def epoch_stats(self, k: int = 5) -> dict[str, Any]:
        stats = {**super().epoch_stats(k), "backed_off": self.backed_off, "fraction": self.fraction}
        if self.trimmed:
            above = self.sampler.trim[0]
            stats["trimmed_cases"] = [int(i) for i in np.flatnonzero(np.asarray(self.losses) > above)]
        return stats

    def release(self) -> None:
        """End the ``hold_uniform`` phase (robust weighting from the next draw on); idempotent."""
        if self.held_uniform:
            self.held_uniform = False
            self.resolve_beta()

    def set_progress(self, fraction: float) -> None:
        was_uniform = self.in_uniform_phase
        super().set_progress(fraction)
        if was_uniform != self.in_uniform_phase:
            self.resolve_beta()

    def solve_beta(self, losses: ArrayLike) -> float:
        """The beta of the rule for these stale losses (never 0: a tiny beta is uniform anyway)."""
        return self.solve_temperature(losses)[0]

    def solve_temperature(self, losses: ArrayLike) -> tuple[float, float]:
        """``(beta, loss ceiling)`` of the rule for these stale losses (ceiling ``inf`` without
        ``max_weight``)."""
        if self.in_uniform_phase:
            return UNIFORM_BETA, math.inf
        ceiling = math.inf
        if self.rule == "spread":
            beta = max(beta_from_spread(losses, self.kappa, self.beta_max), UNIFORM_BETA)
            if self.max_weight is not None:
                ceiling = loss_ceiling(losses, beta, self.max_weight)
        elif self.max_weight is not None:
            beta, ceiling = solve_capped_beta_for_perplexity(losses, self.fraction, self.beta_max, self.max_weight)
        else:
            beta = solve_beta_for_perplexity(losses, self.fraction, self.beta_max)
        return max(beta, UNIFORM_BETA), ceiling

    def solve_distribution(self, losses: ArrayLike) -> tuple[float, float, tuple[float, float]]:
        """``(beta, loss ceiling, outlier trim)`` for these stale losses: with ``trim_fraction``,
        beta and the ceiling are solved over the cases the trim keeps."""
        x = np.asarray(losses, dtype=np.float64).reshape(-1)
        if not self.trimmed or self.in_uniform_phase:
            return (*self.solve_temperature(x), NO_TRIM)
        kept = np.partition(x, x.size - self.trimmed - 1)[: x.size - self.trimmed]
        beta, ceiling = self.solve_temperature(kept)
        return beta, ceiling, outlier_trim(x, self.trimmed, beta, ceiling)

    def resolve_beta(self) -> float:
        """Solve beta (the ceiling, the outlier trim) for the current stale losses and put them in
        force (O(n))."""
        beta, ceiling, trim = self.solve_distribution(self.sampler.losses)
        self.sampler.set_beta(beta, ceiling, trim)
        self._updates_since_solve = 0
        return beta

    def _after_update(self) -> None:
        self._updates_since_solve += 1
        if self._updates_since_solve >= self.adapt_every:
            self.resolve_beta()

    def describe(self) -> str:
        rule = (f"perplexity >= {self.fraction:g} n" if self.rule == "perplexity" else f"beta = {self.kappa:g} / std(L)")
        text = "scale-free " + super().describe() + f"; beta re-solved every {self.adapt_every} update(s) ({rule}, " \
                                                    f"beta <= {self.beta_max:g})"
        if self.max_weight is not None:
            text += f"; no case above {self.max_weight:g} / n of the probability"
        if self.trimmed:
            text += (f"; the {self.trimmed} hardest case(s) ({100 * self.trim_fraction:g}%) left out of the hardness "
                     "distribution, drawn at the uniform rate")
        if self.uniform_until > 0:
            text += f"; uniform sampling (ERM) for the first {100 * self.uniform_until:g}% of training"
        if self.held_uniform:
            text += "; uniform sampling (ERM) until released"
        if self.backed_off:
            text += "; backed off to uniform sampling (ERM) by the stability guard"
        return text

    def robust_loss(self) -> float:
        """``<q, L> - KL(q || uniform) / beta`` for the distribution in force (the closed form
        ``log(mean(exp(beta L))) / beta`` when no ceiling or trim binds)."""
        if self.sampler.ceiling == math.inf and self.sampler.trim == NO_TRIM:
            return super().robust_loss()
        q = self.probabilities()
        kl = math.log(q.size) - entropy(q)  # KL(q || uniform)
        return float(q @ np.asarray(self.losses)) - kl / self.current_beta

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "adaptive_beta": self.current_beta, "loss_ceiling": self.sampler.ceiling,
                "outlier_trim": list(self.sampler.trim),
                "updates_since_solve": self._updates_since_solve, "held_uniform": self.held_uniform,
                "backed_off": self.backed_off, "fraction": self.fraction}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the beta in force; a fixed-beta run's state (no ``adaptive_beta``) gets its beta
        re-solved for the loaded losses."""
        sampler_state = dict(state["sampler"])
        sampler_state.pop("beta", None)  # the sampler's beta is this scheme's business, not a mismatch
        super().load_state_dict({"sampler": sampler_state, "weight_scale": state.get("weight_scale", 1.0)})
        self.held_uniform = bool(state.get("held_uniform", False))  # absent in a fixed-beta run's state
        self.backed_off = bool(state.get("backed_off", False))
        self.fraction = float(state.get("fraction", self.fraction))
        beta = state.get("adaptive_beta")
        ceiling = float(state.get("loss_ceiling", math.inf))
        trim = tuple(float(v) for v in state.get("outlier_trim", NO_TRIM))
        if beta is not None and math.isfinite(beta) and beta > 0 and not math.isnan(ceiling):
            self.sampler.set_beta(float(beta), ceiling if self.max_weight is not None else math.inf,
                                  trim if self.trimmed else NO_TRIM)
            self._updates_since_solve = int(state.get("updates_since_solve", 0))
        else:
            self.resolve_beta()


class Chi2HardnessWeighting(HardnessWeighting):
    """Pearson chi-square DRO: ``p_i = max(0, 1 + beta (L_i - lam)) / n`` with the threshold solved
    exactly; the importance ratio is ``(1 + beta (l - lam)) / (1 + beta (L_i - lam))``."""

    scheme = "chi2"
    divergence = "chi2"

    def robust_loss(self) -> float:
        return chi2_dro_objective(self.losses, self.current_beta)
