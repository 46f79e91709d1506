"""One lab trainer variant, attributes only: found by the discovery of ``nnunet_dro.lab.variants``."""
from dataclasses import replace

from nnunet_dro.lab.variants.nnUNetTrainerDROAdaptive_fromStart import nnUNetTrainerDROAdaptive_fromStart


class nnUNetTrainerDROAdaptive_f25_noIS_cap5(nnUNetTrainerDROAdaptive_fromStart):
    """The default before its ERM phase (``_fromStart``) made stronger: the drawing distribution may shrink to a perplexity of a quarter
    of the cases, still with no case above 5 / n. Near the cap's own limit (uniform over the hardest
    n / 5 cases has perplexity n / 5), so p is close to the hardest fifth to quarter of the cases
    drawn evenly: a label-free counterpart of balanced sampling."""
    dro_settings = replace(nnUNetTrainerDROAdaptive_fromStart.dro_settings, fraction=0.25)
