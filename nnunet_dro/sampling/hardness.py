"""The hardness weighted sampler of Algorithm 1 (Fidon et al., arXiv:2001.02658).

Volumes are drawn i.i.d. *with replacement* from ``p = softmax(beta * L)`` where ``L`` holds the
stale loss of every training volume; each fresh loss replaces its stale value; importance
weights ``clip(exp(beta * (l - L_i)), w_min, w_max)`` correct for the staleness.

How it is cheap: a sum tree over ``exp(beta * (L_i - c))`` gives one draw and one update in
O(log n) (a descent / an ascent of about log2(n) nodes) instead of the O(n) softmax and
``numpy.random.choice`` of the reference code. The reference ``c`` is re-centred to ``max(L)``
(an O(n) rebuild) only when a new loss would overflow the exponent or the total underflows, so
the rebuilds are rare. Probabilities returned by :meth:`probabilities` are computed directly from
``L`` in float64 and are exact.

A loss ceiling (``set_beta(beta, ceiling)``, used by capped schemes such as
:class:`~nnunet_dro.weighting.AdaptiveHardnessWeighting` with ``max_weight``) makes every weight
``exp(beta * (min(L_i, ceiling) - c))``: the cases above it share the same, largest probability.
Without one (``inf``, the default) this is exactly Algorithm 1. An outlier trim
(``set_beta(beta, ceiling, trim=(above, to))``, :func:`~nnunet_dro.sampling.temperature.outlier_trim`)
counts every loss above ``above`` as ``to``: the leaf weight is ``exp(beta * (g(L_i) - c))`` with
``g`` = :func:`~nnunet_dro.sampling.temperature.effective_losses`.

How it is shared: see :mod:`nnunet_dro.sampling.storage`. Writers (the owner's ``update``) bracket
their writes with a sequence counter (a seqlock); readers in other processes retry a draw that
overlapped a write, so they never see a half-updated tree. Even a torn read can only ever give a
valid index: the descent always ends in a leaf.
"""
from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from nnunet_dro.sampling.distributions import (
    chi2_dro_probabilities,
    clip_log_weights,
    effective_sample_size,
    entropy,
    hardest,
)
from nnunet_dro.sampling.storage import (
    BETA,
    CEILING,
    CENTRE,
    NUM_SKIPPED,
    NUM_UPDATES,
    SEQUENCE,
    TRIM_ABOVE,
    TRIM_TO,
    WARMUP,
    SamplerStorage,
)
from nnunet_dro.sampling.temperature import NO_TRIM, capped_softmax, effective_losses

# Re-centre when beta * (L - c) would exceed this (exp(300) ~ 2e130: sums of 1e7 of them stay
# finite) or when the total weight falls below exp(-RECENTRE_EXPONENT) (underflow ahead).
RECENTRE_EXPONENT = 300.0
_MAX_EXPONENT = 700.0  # math.exp overflows above ~709.78; torn reads must not raise
_MIN_TOTAL = math.exp(-RECENTRE_EXPONENT)
_READ_RETRIES = 1000
# Above this many distinct volumes in one update, an O(n) vectorised rebuild beats b ascents.
_VECTORISED_UPDATE_ABOVE = 4096
STATE_VERSION = 1
DIVERGENCES = ("kl", "chi2")


@dataclass(frozen=True)
class ImportanceClip:
    """The sampler's importance weights: ``enabled`` (False: :meth:`HardnessWeightedSampler.importance_weights`
    returns ones) and ``clip``, ``(w_min, w_max)``, the interval they are clipped to.

    >>> ImportanceClip(), ImportanceClip(enabled=False).clip
    (ImportanceClip(enabled=True, clip=(0.1, 10.0)), (0.1, 10.0))
    """

    enabled: bool = True
    clip: tuple[float, float] = (0.1, 10.0)


#: no importance weights (ones): the samplers behind uniform or fixed-weight draws
NO_IMPORTANCE = ImportanceClip(enabled=False)


class HardnessWeightedSampler:
    """Per-volume hardness weighted sampler for KL distributionally robust optimisation.

    Args:
        num_cases: number of training volumes ``n``.
        beta: inverse temperature; ``beta -> 0`` is uniform sampling (ERM). Paper default 100.
        init_loss: initial stale loss, a scalar (plus tiny seeded noise that breaks ties, at
            most ``1e-6 * max(1, |init_loss|)``) or a vector of ``n`` finite values (used as is).
        importance: an :class:`ImportanceClip`: ``enabled`` (False: :meth:`importance_weights`
            returns ones) and ``clip``, ``(w_min, w_max)`` for the importance weights.
        seed: seeds the draws (and the tie-breaking noise). Every other process that uses a
            copy of the sampler derives its own stream from ``(seed, pid)``, so forked workers
            never repeat each other's draws.
        shared: keep the state in shared memory so that copies in other processes (forked, or
            pickled to spawned ones) follow this object's updates.
        divergence: ``"kl"`` (Algorithm 1: ``p = softmax(beta * L)``, O(log n) draws) or
            ``"chi2"`` (Fidon et al. 2020's Pearson chi-square DRO: ``p_i = max(0, 1 + beta (L_i - lam))/n``
            with the threshold ``lam`` solved exactly; O(n log n) per batch, fine for the
            thousands of volumes of a segmentation dataset). For chi2 the importance weight is
            the ratio ``(1 + beta (l - lam)) / (1 + beta (L_i - lam))``, clipped.
        warmup: start with a uniform warm-up pass (Fidon et al. 2020): draws are uniform over the volumes
            that have not yet received a loss, importance weights are 1, and hardness sampling
            starts by itself (in every process) once each volume has a fresh loss.

    Duplicates in one batch: every occurrence gets its own importance weight (against the stale
    loss), and the stale loss becomes the *mean* of that volume's fresh losses in the batch.
    Non-finite losses never enter the state: they are skipped, counted (``num_skipped``) and
    warned about; their importance weight is the neutral 1.

    Example (the loop of Algorithm 1):

    >>> s = HardnessWeightedSampler(5, beta=10.0, seed=0)
    >>> idx = s.sample(2)
    >>> fresh = np.array([0.3, 0.9])          # per-volume losses from the network
    >>> w = s.importance_weights(idx, fresh)  # weight each loss by w before averaging
    >>> s.update(idx, fresh)
    >>> bool(np.isclose(s.probabilities().sum(), 1.0))
    True
    >>> s.close()
    """

    def __init__(self, num_cases: int, beta: float = 100.0, init_loss: float | ArrayLike = 1.0, *,
                 importance: ImportanceClip = ImportanceClip(), seed: int | None = None, shared: bool = False,
                 divergence: str = "kl", warmup: bool = False):
        num_cases = int(num_cases)
        importance_sampling, clip = importance.enabled, importance.clip
        if divergence not in DIVERGENCES:
            raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
        if num_cases < 1:
            raise ValueError(f"num_cases must be >= 1, got {num_cases}")
        if not (math.isfinite(beta) and beta > 0):
            raise ValueError(f"beta must be a finite positive number, got {beta}")
        w_min, w_max = float(clip[0]), float(clip[1])
        if not (0 < w_min <= w_max < math.inf):
            raise ValueError(f"clip must satisfy 0 < w_min <= w_max < inf, got {clip}")
        self.num_cases = num_cases
        self.importance_sampling = bool(importance_sampling)
        self.clip = (w_min, w_max)
        self.seed = seed
        self.divergence = divergence
        self._storage = SamplerStorage(num_cases, shared=shared)
        self._storage.header_float[BETA] = float(beta)
        self._storage.header_float[CEILING] = math.inf
        self._storage.header_float[TRIM_ABOVE], self._storage.header_float[TRIM_TO] = NO_TRIM
        self._rng = np.random.default_rng(seed)
        self._rng_pid = os.getpid()
        self._storage.losses[:] = self._initial_losses(init_loss)
        self._storage.header_int[WARMUP] = int(bool(warmup))
        self._rebuild()

    # ------------------------------------------------------------------ construction helpers
    def _initial_losses(self, init_loss: float | ArrayLike) -> NDArray[np.float64]:
        init = np.asarray(init_loss, dtype=np.float64)
        if init.ndim == 0:
            if not np.isfinite(init):
                raise ValueError(f"init_loss must be finite, got {float(init)}")
            scale = 1e-6 * max(1.0, abs(float(init)))
            return float(init) + self._rng.uniform(0.0, scale, self.num_cases)
        if init.shape != (self.num_cases,):
            raise ValueError(f"init_loss vector has shape {init.shape}, expected ({self.num_cases},)")
        if not np.all(np.isfinite(init)):
            raise ValueError("init_loss vector contains NaN or inf")
        return init.copy()

    # ------------------------------------------------------------------ sum tree
    # Internal node k (1 <= k < n) has children 2k and 2k+1; a child j >= n is the leaf of
    # volume j - n, whose weight exp(beta * (L - c)) is computed from L instead of stored. This
    # is a full binary tree for any n, and keeps the state at 24 bytes per volume.
    def _rebuild(self, beta: float | None = None, ceiling: float | None = None,
                 trim: tuple[float, float] | None = None) -> None:
        """O(n): re-centre ``c`` on max(g(L)) and recompute every internal node (for a new beta,
        ceiling or outlier trim)."""
        st, n = self._storage, self.num_cases
        beta = self.beta if beta is None else float(beta)
        ceiling = self.ceiling if ceiling is None else float(ceiling)
        trim = self.trim if trim is None else (float(trim[0]), float(trim[1]))
        capped = effective_losses(st.losses, ceiling, trim)
        centre = float(capped.max())
        full = np.empty(2 * n, dtype=np.float64)
        full[n:] = np.exp(beta * (capped - centre))
        hi = n
        while hi > 1:  # one level at a time, bottom-up: nodes [lo, hi) have children >= hi
            lo = (hi + 1) // 2
            k = np.arange(lo, hi)
            full[k] = full[2 * k] + full[2 * k + 1]
            hi = lo
        self._begin_write()
        st.header_float[CENTRE] = centre
        st.header_float[BETA] = beta
        st.header_float[CEILING] = ceiling
        st.header_float[TRIM_ABOVE], st.header_float[TRIM_TO] = trim
        st.tree[1:] = full[1:n]
        st.tree[0] = 0.0
        self._end_write()

    def _begin_write(self) -> None:
        self._storage.header_int[SEQUENCE] += 1  # odd: readers retry

    def _end_write(self) -> None:
        self._storage.header_int[SEQUENCE] += 1

    # ------------------------------------------------------------------ public API
    def sample(self, batch_size: int) -> NDArray[np.int64]:
        """Draw ``batch_size`` volume indices i.i.d. with replacement from ``softmax(beta * L)``.

        O(batch_size * log n). Safe to call in any process holding a copy of a shared sampler.
        """
        return self.sample_with_beta(batch_size)[0]

    def sample_with_beta(self, batch_size: int) -> tuple[NDArray[np.int64], float]:
        """:meth:`sample`, and the beta the draw used (an adaptive scheme may change beta between
        the draw in a data-augmentation worker and the training step that weights the batch)."""
        batch_size = int(batch_size)
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {batch_size}")
        rng = self._process_rng()
        st = self._storage
        if self.num_cases == 1 or batch_size == 0:
            return np.zeros(batch_size, dtype=np.int64), self.beta
        if st.mv_header[WARMUP]:
            return self._sample_warmup(batch_size, rng), self.beta
        if self.divergence == "chi2":
            return rng.choice(self.num_cases, batch_size, p=self.probabilities()), self.beta
        header, losses, tree, fheader = st.mv_header, st.mv_losses, st.mv_tree, st.mv_centre_view
        n, exp = self.num_cases, math.exp
        last_attempt = _READ_RETRIES - 1
        for attempt in range(_READ_RETRIES):
            seq = header[SEQUENCE]
            if seq & 1 and attempt < last_attempt:
                time.sleep(0)  # the owner is writing: let it finish
                continue
            centre, total, beta, ceiling = fheader[CENTRE], tree[1], fheader[BETA], fheader[CEILING]
            trim_above, trim_to = fheader[TRIM_ABOVE], fheader[TRIM_TO]
            drawn = []
            for r in rng.random(batch_size).tolist():
                # descend from the root, going left with probability w_left / w_node
                u, k = r * total, 1
                while k < n:
                    k += k
                    if k < n:
                        w_left = tree[k]
                    else:
                        x = losses[k - n]
                        w_left = exp(min(_MAX_EXPONENT, beta * (min(trim_to if x > trim_above else x, ceiling) - centre)))
                    if u >= w_left:
                        u -= w_left
                        k += 1
                drawn.append(k - n)
            # a draw that overlapped a write is redone; after many tries (a writer that never
            # pauses) the indices are still valid, only drawn from a mix of old and new losses
            if header[SEQUENCE] == seq or attempt == last_attempt:
                break
        return np.array(drawn, dtype=np.int64), float(beta)

    def _sample_warmup(self, batch_size: int, rng: np.random.Generator) -> NDArray[np.int64]:
        """Uniform over the volumes without a fresh loss yet (over all once every one has one)."""
        unseen = np.flatnonzero(self._storage.counts == 0)
        pool = unseen if unseen.size else np.arange(self.num_cases)
        return pool[rng.integers(0, pool.size, batch_size)].astype(np.int64)

    @property
    def beta(self) -> float:
        """The inverse temperature in force (shared with every process that maps the state)."""
        return float(self._storage.header_float[BETA])

    @property
    def ceiling(self) -> float:
        """The loss ceiling in force (``inf``: none): ``p = softmax(beta * min(L, ceiling))``."""
        return float(self._storage.header_float[CEILING])

    @property
    def trim(self) -> tuple[float, float]:
        """The outlier trim in force, ``(above, to)``: a loss above ``above`` counts as ``to`` in p
        (:data:`~nnunet_dro.sampling.temperature.NO_TRIM`: none)."""
        header = self._storage.header_float
        return float(header[TRIM_ABOVE]), float(header[TRIM_TO])

    def set_beta(self, beta: float, ceiling: float | None = None, trim: tuple[float, float] | None = None) -> None:
        """Change beta, and the loss ceiling and the outlier trim unless they are None (an O(n)
        rebuild of the sum tree; a no-op if nothing changes). Draws in other processes see the new
        values at once; a draw that overlapped the change is redone."""
        beta = float(beta)
        if not (math.isfinite(beta) and beta > 0):
            raise ValueError(f"beta must be a finite positive number, got {beta}")
        ceiling = self.ceiling if ceiling is None else float(ceiling)
        if math.isnan(ceiling):
            raise ValueError("the loss ceiling must be a number or inf, got nan")
        trim = self.trim if trim is None else (float(trim[0]), float(trim[1]))
        if math.isnan(trim[0]) or not math.isfinite(trim[1]):
            raise ValueError(f"an outlier trim must be (a number or inf, a finite number), got {trim}")
        if (ceiling != math.inf or trim != NO_TRIM) and self.divergence != "kl":
            raise ValueError("a loss ceiling or outlier trim applies to the KL divergence only")
        if beta == self.beta and ceiling == self.ceiling and trim == self.trim:
            return
        self._rebuild(beta, ceiling, trim)

    @property
    def in_warmup(self) -> bool:
        """True while the uniform warm-up pass is still filling the stale losses."""
        return bool(self._storage.header_int[WARMUP])

    def importance_weights(self, indices: ArrayLike, losses: ArrayLike) -> NDArray[np.float64]:
        """``clip(exp(beta * (losses - L[indices])), w_min, w_max)``, computed in log space.

        Call before :meth:`update` (it compares against the stale losses). Ones if importance
        sampling is off; a non-finite loss gets the neutral weight 1.
        """
        idx, fresh = self._check_batch(indices, losses)
        if not self.importance_sampling or self.in_warmup:
            return np.ones(idx.shape, dtype=np.float64)
        log_w = np.where(np.isfinite(fresh), self.log_importance_ratios(idx, fresh, self.beta), 0.0)
        return clip_log_weights(log_w, self.clip)

    def log_importance_ratios(self, idx: NDArray[np.int64], fresh: NDArray[np.float64],
                              beta: float | NDArray[np.float64]) -> NDArray[np.float64]:
        """Log of the unclipped importance ratio ``p_new / p_old`` of each drawn volume, against the
        stale losses (NaN/inf pass through: callers decide what a non-finite loss weighs).

        KL: ``beta * (g(l) - g(L_i))``, both losses clipped at the loss ceiling (and an outlier's
        counted as the trim's value, :func:`~nnunet_dro.sampling.temperature.effective_losses`). Chi-square (always at
        the sampler's own beta): ``log((1 + beta (l - lam)) / (1 + beta (L_i - lam)))``; ``+inf``
        for a volume outside the active set (``p_old = 0``), ``-inf`` for a fresh loss below it.
        """
        if self.divergence == "chi2":
            return self._chi2_log_ratios(idx, fresh)
        ceiling, trim = self.ceiling, self.trim
        with np.errstate(invalid="ignore", over="ignore"):
            return beta * (effective_losses(fresh, ceiling, trim) - effective_losses(self._storage.losses[idx], ceiling, trim))

    def _chi2_log_ratios(self, idx: NDArray[np.int64], fresh: NDArray[np.float64]) -> NDArray[np.float64]:
        losses = np.array(self._storage.losses)
        p = chi2_dro_probabilities(losses, self.beta)
        # p_i = (1 + beta (L_i - lam)) / n on the active set: recover lam from any active volume
        j = int(np.argmax(p))
        lam = losses[j] - (p[j] * self.num_cases - 1.0) / self.beta
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            new = np.maximum(0.0, 1.0 + self.beta * (fresh - lam))
            old = np.maximum(0.0, 1.0 + self.beta * (losses[idx] - lam))
            return np.where(old > 0, np.log(new) - np.log(old), np.inf)

    def update(self, indices: ArrayLike, losses: ArrayLike) -> None:
        """Set ``L[indices] <- losses`` (O(b log n)); duplicates take the mean of their losses."""
        idx, fresh = self._check_batch(indices, losses)
        st = self._storage
        fresh_by_volume: dict[int, list[float]] = {}
        skipped = []
        for i, value in zip(idx.tolist(), fresh.tolist()):
            if math.isfinite(value):
                fresh_by_volume.setdefault(i, []).append(value)
            else:
                skipped.append(i)
        if skipped:
            header = st.mv_header
            header[NUM_SKIPPED] += len(skipped)
            warnings.warn(f"HardnessWeightedSampler: skipped {len(skipped)} non-finite loss value(s) "
                          f"for volume(s) {sorted(set(skipped))}; their stale losses are kept "
                          f"({header[NUM_SKIPPED]} skipped so far)", RuntimeWarning, stacklevel=2)
        if not fresh_by_volume:
            return
        if len(fresh_by_volume) > _VECTORISED_UPDATE_ABOVE:
            self._update_many(fresh_by_volume)
            return
        header, losses, tree, counts = st.mv_header, st.mv_losses, st.mv_tree, st.mv_counts
        centre = st.mv_centre_view[CENTRE]
        n, beta, exp = self.num_cases, st.mv_centre_view[BETA], math.exp
        ceiling = st.mv_centre_view[CEILING]
        trim_above, trim_to = st.mv_centre_view[TRIM_ABOVE], st.mv_centre_view[TRIM_TO]
        header[SEQUENCE] += 1  # seqlock: odd while writing
        highest = -math.inf
        for i, values in fresh_by_volume.items():
            mean = values[0] if len(values) == 1 else math.fsum(values) / len(values)
            losses[i] = mean
            counts[i] += len(values)
            counted = min(trim_to if mean > trim_above else mean, ceiling)
            if counted > highest:
                highest = counted
        header[NUM_UPDATES] += 1
        recentre = beta * (highest - centre) > RECENTRE_EXPONENT
        if not recentre and n > 1:
            for leaf in fresh_by_volume:
                # recompute the internal nodes on the path from the leaf to the root (sums of
                # the children, not increments: no round-off drift however long training runs)
                k = (leaf + n) >> 1
                while k:
                    a = k + k
                    if a < n:
                        wa = tree[a]
                    else:
                        x = losses[a - n]
                        wa = exp(min(_MAX_EXPONENT, beta * (min(trim_to if x > trim_above else x, ceiling) - centre)))
                    a += 1
                    if a < n:
                        wb = tree[a]
                    else:
                        x = losses[a - n]
                        wb = exp(min(_MAX_EXPONENT, beta * (min(trim_to if x > trim_above else x, ceiling) - centre)))
                    tree[k] = wa + wb
                    k >>= 1
            recentre = not (tree[1] > _MIN_TOTAL)
        header[SEQUENCE] += 1
        if recentre:
            self._rebuild()
        self._maybe_end_warmup()

    def _maybe_end_warmup(self) -> None:
        st = self._storage
        if st.mv_header[WARMUP] and bool(np.all(st.counts > 0)):
            st.mv_header[WARMUP] = 0

    def _update_many(self, fresh_by_volume: dict[int, list[float]]) -> None:
        """Large batches (e.g. all ranks' updates at once, a warm-up epoch): vectorised."""
        st = self._storage
        unique = np.fromiter(fresh_by_volume, dtype=np.int64, count=len(fresh_by_volume))
        sizes = np.array([len(v) for v in fresh_by_volume.values()], dtype=np.int64)
        means = np.array([math.fsum(v) / len(v) for v in fresh_by_volume.values()])
        self._begin_write()
        st.losses[unique] = means
        st.counts[unique] += sizes
        st.header_int[NUM_UPDATES] += 1
        self._end_write()
        self._rebuild()
        self._maybe_end_warmup()

    def probabilities(self) -> NDArray[np.float64]:
        """The hardness distribution, exact in float64 (O(n)): ``softmax(beta * L)`` for KL,
        the clipped linear rule for chi2. (During a warm-up, draws are uniform instead.) With a
        loss ceiling: ``softmax(beta * min(L, ceiling))``; with an outlier trim, of the losses the
        trim counts (:func:`~nnunet_dro.sampling.temperature.effective_losses`)."""
        if self.divergence == "chi2":
            return chi2_dro_probabilities(self.losses, self.beta)
        return capped_softmax(self.losses, self.beta, self.ceiling, self.trim)

    @property
    def losses(self) -> NDArray[np.float64]:
        """Read-only view of the stale losses ``L``."""
        view = self._storage.losses.view()
        view.flags.writeable = False
        return view

    @property
    def draw_counts(self) -> NDArray[np.int64]:
        """Read-only view: fresh losses received per volume (times it was drawn and used)."""
        view = self._storage.counts.view()
        view.flags.writeable = False
        return view

    @property
    def num_skipped(self) -> int:
        """How many non-finite losses :meth:`update` refused."""
        return int(self._storage.header_int[NUM_SKIPPED])

    @property
    def state_nbytes(self) -> int:
        """Bytes of sampler state (24 per volume plus an 80-byte header)."""
        return self._storage.nbytes

    def stats(self, k: int = 5) -> dict[str, Any]:
        """Summary for logs: entropy of p (nats), effective sample size ``1/sum(p^2)``, max p,
        the ``k`` hardest volumes as ``(index, stale loss)`` (hardest first), skipped count.

        O(n) vectorised: fine once per epoch even for millions of volumes.
        """
        p = self.probabilities()
        return {
            "entropy": entropy(p),
            "max_entropy": math.log(self.num_cases),
            "effective_sample_size": effective_sample_size(p),
            "max_probability": float(p.max()),
            "hardest": hardest(self.losses, k),
            "num_skipped": self.num_skipped,
        }

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Plain numpy/python objects (``torch.save``-able): losses, draw counts, RNG state."""
        st = self._storage
        return {
            "version": STATE_VERSION,
            "num_cases": self.num_cases,
            "beta": self.beta,
            "ceiling": self.ceiling,
            "trim": self.trim,
            "importance_sampling": self.importance_sampling,
            "clip": tuple(self.clip),
            "losses": np.array(st.losses),
            "draw_counts": np.array(st.counts),
            "num_skipped": int(st.header_int[NUM_SKIPPED]),
            "num_updates": int(st.header_int[NUM_UPDATES]),
            "rng_state": self._rng.bit_generator.state,
            "divergence": self.divergence,
            "warmup": self.in_warmup,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore losses, counts and RNG state (beta, clip and IS stay as constructed; an adaptive
        scheme restores its beta with :meth:`set_beta`)."""
        saved_n = int(state["num_cases"])
        if saved_n != self.num_cases:
            raise ValueError(f"state is for {saved_n} volumes, this sampler has {self.num_cases}")
        losses = np.asarray(state["losses"], dtype=np.float64)
        if losses.shape != (self.num_cases,) or not np.all(np.isfinite(losses)):
            raise ValueError("state 'losses' must be a finite vector of length num_cases")
        for key in ("beta", "importance_sampling", "divergence"):
            if key in state and state[key] != getattr(self, key):
                warnings.warn(f"state was saved with {key}={state[key]}, sampler uses "
                              f"{getattr(self, key)}", RuntimeWarning, stacklevel=2)
        st = self._storage
        self._begin_write()
        st.losses[:] = losses
        st.counts[:] = np.asarray(state["draw_counts"], dtype=np.int64)
        st.header_int[NUM_SKIPPED] = int(state.get("num_skipped", 0))
        st.header_int[NUM_UPDATES] = int(state.get("num_updates", 0))
        st.header_int[WARMUP] = int(bool(state.get("warmup", False)))
        self._end_write()
        self._rebuild()
        if state.get("rng_state") is not None:
            self._rng.bit_generator.state = state["rng_state"]
            self._rng_pid = os.getpid()

    # ------------------------------------------------------------------ processes
    def _process_rng(self) -> np.random.Generator:
        """The RNG of this process: a copy in a new process derives its own stream."""
        pid = os.getpid()
        if pid != self._rng_pid:
            if self.seed is None:
                self._rng = np.random.default_rng()
            else:
                self._rng = np.random.default_rng(np.random.SeedSequence([int(self.seed), pid]))
            self._rng_pid = pid
        return self._rng

    def __getstate__(self) -> dict[str, Any]:
        config = {"num_cases": self.num_cases, "beta": self.beta,
                  "importance_sampling": self.importance_sampling, "clip": self.clip,
                  "seed": self.seed, "divergence": self.divergence}
        if self._storage.shared:
            return {"config": config, "shm_name": self._storage.name}
        return {"config": config, "state": self.state_dict()}

    def __setstate__(self, data: dict[str, Any]) -> None:
        config = dict(data["config"])
        beta = float(config.pop("beta"))
        self.__dict__.update(config)
        self._rng = np.random.default_rng(self.seed)
        self._rng_pid = -1  # derive a per-process stream on first draw
        if "shm_name" in data:  # beta lives in the shared header
            self._storage = SamplerStorage.attach(data["shm_name"], self.num_cases)
        else:
            self._storage = SamplerStorage(self.num_cases)
            self._storage.header_float[BETA] = beta
            self._storage.header_float[CEILING] = float(data["state"].get("ceiling", math.inf))
            self._storage.header_float[TRIM_ABOVE], self._storage.header_float[TRIM_TO] = data["state"].get("trim", NO_TRIM)
            self.load_state_dict(data["state"])

    @property
    def shared(self) -> bool:
        return self._storage.shared

    def close(self) -> None:
        """Release the state; the owner of a shared block unlinks it. Idempotent."""
        self._storage.close()

    def __enter__(self) -> "HardnessWeightedSampler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        ceiling = "" if self.ceiling == math.inf else f", ceiling={self.ceiling:g}"
        if self.trim != NO_TRIM:
            ceiling += f", trim=({self.trim[0]:g}, {self.trim[1]:g})"
        return (f"{type(self).__name__}(num_cases={self.num_cases}, beta={self.beta}{ceiling}, "
                f"importance_sampling={self.importance_sampling}, clip={self.clip}, "
                f"divergence={self.divergence!r}, shared={self.shared})")

    def _check_batch(self, indices: ArrayLike, losses: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        return check_batch(indices, losses, self.num_cases)


def check_batch(indices: ArrayLike, losses: ArrayLike, num_cases: int) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Validated ``(indices, losses)``: int64 / float64 vectors of equal length, indices in
    ``[0, num_cases)``. Shared by the sampler and the case-weighting schemes."""
    idx = np.asarray(indices).reshape(-1)
    fresh = np.asarray(losses, dtype=np.float64).reshape(-1)
    if idx.shape != fresh.shape:
        raise ValueError(f"{idx.size} indices but {fresh.size} losses")
    if idx.size == 0:
        return idx.astype(np.int64), fresh
    if idx.dtype.kind not in "iu":
        raise ValueError(f"indices must be integers, got dtype {idx.dtype}")
    as_list = idx.tolist()  # builtin min/max: faster than numpy's for a handful of values
    if min(as_list) < 0 or max(as_list) >= num_cases:
        raise IndexError(f"indices must lie in [0, {num_cases}), got [{min(as_list)}, {max(as_list)}]")
    return idx.astype(np.int64, copy=False), fresh
