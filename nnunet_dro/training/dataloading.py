"""nnU-Net's training data loader, drawing its cases from the shared case weighting.

nnU-Net runs its data loader inside data-augmentation worker processes. The sampler handed to
:class:`nnUNetDataLoaderDRO` keeps its stale losses in shared memory, so every worker draws from
the distribution the main process has just updated (a sampler
updated only in the main process would leave the workers drawing from stale copies).

Only *which cases* make up a batch changes: nnU-Net's foreground oversampling (decided per
batch position), cropping and augmentation are untouched. The batch already carries the drawn
case identifiers under ``'keys'``; the trainer maps them back to sampler indices. The batch also
carries ``'dro_beta'``, the inverse temperature each case was drawn with: batches wait in a queue
for several steps, and an adaptive scheme may change beta meanwhile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple, Union

import numpy as np
from nnunetv2.training.dataloading.data_loader import nnUNetDataLoader
from nnunetv2.training.dataloading.nnunet_dataset import nnUNetBaseDataset
from nnunetv2.utilities.label_handling.label_handling import LabelManager

from nnunet_dro.sampling import HardnessWeightedSampler
from nnunet_dro.weighting import CaseWeighting


@dataclass(frozen=True)
class CaseDraws:
    """Where the loader's cases come from.

    Args:
        case_ids: the training case identifiers in sampler order (index ``i`` of the sampler is
            ``case_ids[i]``); must be exactly the identifiers of the loader's dataset.
        sampler: a (shared) :class:`~nnunet_dro.weighting.CaseWeighting` or
            :class:`~nnunet_dro.sampling.HardnessWeightedSampler` over ``len(case_ids)`` cases
            (anything with ``num_cases`` and ``sample_with_beta``).
    """

    case_ids: Sequence[str]
    sampler: CaseWeighting | HardnessWeightedSampler


class nnUNetDataLoaderDRO(nnUNetDataLoader):
    """``nnUNetDataLoader`` whose cases are drawn i.i.d. with replacement from ``softmax(beta * L)``.

    ``draws`` (:class:`CaseDraws`) names the cases and the sampler that draws them. The other
    arguments are nnU-Net's, the first five positional as in ``nnUNetDataLoader`` and the rest
    (``oversample_foreground_percent``, ``pad_sides``, ``probabilistic_oversampling``,
    ``transforms``) as keywords passed on unchanged; ``sampling_probabilities`` is not accepted:
    the sampler decides.
    """

    def __init__(self,
                 data: nnUNetBaseDataset,
                 batch_size: int,
                 patch_size: Union[List[int], Tuple[int, ...], np.ndarray],
                 final_patch_size: Union[List[int], Tuple[int, ...], np.ndarray],
                 label_manager: LabelManager,
                 draws: CaseDraws,
                 **nnunet_options: Any):
        if "sampling_probabilities" in nnunet_options:
            raise TypeError("nnUNetDataLoaderDRO draws its cases from draws.sampler: sampling_probabilities is "
                            "not accepted")
        super().__init__(data, batch_size, patch_size, final_patch_size, label_manager,
                         sampling_probabilities=None, **nnunet_options)
        case_ids, sampler = draws.case_ids, draws.sampler
        case_ids = [str(c) for c in case_ids]
        if sorted(case_ids) != sorted(str(i) for i in data.identifiers):
            raise ValueError("case_ids must be exactly the identifiers of the training dataset")
        size = sampler.num_cases
        if size != len(case_ids):
            raise ValueError(f"sampler has {size} volumes but there are {len(case_ids)} cases")
        self.case_ids = np.array(case_ids)
        self.sampler = sampler
        self._draw_beta = float("nan")

    def get_indices(self) -> np.ndarray:
        """The case identifiers of the next batch, drawn from the sampler's current distribution."""
        indices, self._draw_beta = self.sampler.sample_with_beta(self.batch_size)
        return self.case_ids[indices]

    def generate_train_batch(self) -> dict:
        batch = super().generate_train_batch()
        batch["dro_beta"] = np.full(len(batch["keys"]), self._draw_beta, dtype=np.float64)
        return batch
