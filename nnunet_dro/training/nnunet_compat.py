"""Every place where nnunet_dro depends on nnU-Net's internals (beyond its public CLIs and class names).

nnU-Net has no plugin API for what our trainers change, so a few pieces of ``nnUNetTrainer``
are mirrored here. Each item names the upstream function it mirrors; all were checked against
the nnunetv2 versions in :data:`CHECKED_NNUNET_VERSIONS`. :func:`compatibility_problems`
inspects the installed nnunetv2 and lists what no longer has the shape we rely on; the test
suite fails on any entry, with the message, so an nnU-Net upgrade tells us which line broke.

What is mirrored:

- **The checkpoint dict** (:func:`checkpoint_contents` mirrors ``nnUNetTrainer.save_checkpoint``,
  :func:`apply_checkpoint` the body of ``nnUNetTrainer.load_checkpoint``). Our trainers write the
  same dict plus ``'dro_state'`` in one ``torch.save`` and read it with one ``torch.load``; no
  torch function is replaced. (nnunetv2 2.8's ``load_checkpoint`` also fails on a dict argument,
  which :func:`apply_checkpoint` accepts.)
- **The data loaders** (:func:`build_dataloaders` mirrors ``nnUNetTrainer.get_dataloaders``) with
  the training loader supplied by the caller, because ``get_dataloaders`` constructs
  ``nnUNetDataLoader`` inline.
- **nnU-Net's loss objects**: :mod:`nnunet_dro.training.losses` reads the attributes of
  ``DC_and_CE_loss``, ``DC_and_BCE_loss``, ``MemoryEfficientSoftDiceLoss`` and
  ``DeepSupervisionWrapper``; the attribute names are listed in :data:`LOSS_ATTRIBUTES`.
- **The segmentation heads** (:func:`segmentation_heads`, :func:`captured_head_inputs`): the
  ``decoder.seg_layers`` of dynamic_network_architectures' ``UNetDecoder`` (nnU-Net's plain and
  residual-encoder U-Nets), one 1x1(x1) convolution per deep-supervision scale, called lowest
  resolution first while nnU-Net's outputs list the highest first; the GI-LS trainers perturb what
  enters them.
- **The trainer's constructor signature** ``(plans, configuration, fold, dataset_json, device)``:
  nnU-Net records the subclass's arguments by name for checkpoints and ``nnUNetv2_predict``.
- **Model folders, trainer lookup and the inference network** (for ``nnunet_dro export``):
  nnU-Net's folder-name helpers of ``file_path_utilities`` and ``maybe_convert_to_dataset_name``
  (re-exported), :func:`find_trainer_class` (``recursive_find_python_class`` as
  ``nnUNetv2_predict`` searches nnunetv2 and each ``nnUNet_extTrainer`` folder) and
  :func:`inference_network_inputs` (``PlansManager`` and ``determine_num_input_channels``, as
  ``nnUNetPredictor`` builds the network).
"""
from __future__ import annotations

import inspect
import os
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch
from batchgenerators.dataloading.nondet_multi_threaded_augmenter import NonDetMultiThreadedAugmenter
from batchgenerators.dataloading.single_threaded_augmenter import SingleThreadedAugmenter
from nnunetv2.training.dataloading.data_loader import nnUNetDataLoader
from nnunetv2.training.dataloading.nnunet_dataset import infer_dataset_class
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name  # noqa: F401 (export)
from nnunetv2.utilities.default_n_proc_DA import get_allowed_n_proc_DA
from nnunetv2.utilities.file_path_utilities import (  # noqa: F401 (nnunet_dro.workflows.export)
    convert_ensemble_folder_to_model_identifiers_and_folds,
    convert_identifier_to_trainer_plans_config,
    convert_trainer_plans_config_to_identifier,
    folds_tuple_to_string,
)
from nnunetv2.utilities.find_class_by_name import recursive_find_python_class
from nnunetv2.utilities.label_handling.label_handling import determine_num_input_channels
from nnunetv2.utilities.plans_handling.plans_handler import ConfigurationManager, PlansManager
from torch._dynamo import OptimizedModule

#: nnunetv2 releases whose code the mirrored pieces were compared with, line by line.
CHECKED_NNUNET_VERSIONS = ("2.8.1",)

#: The keys ``nnUNetTrainer.save_checkpoint`` writes (nnunetv2 2.8.1).
NNUNET_CHECKPOINT_KEYS = ("network_weights", "optimizer_state", "grad_scaler_state", "logging", "_best_ema",
                          "current_epoch", "init_args", "trainer_name", "inference_allowed_mirroring_axes")

#: The constructor signature nnU-Net expects of every trainer (it records the arguments by name).
TRAINER_INIT_PARAMETERS = ("self", "plans", "configuration", "fold", "dataset_json", "device")

#: Keyword arguments of ``nnUNetDataLoader.__init__`` that our loader passes on.
DATALOADER_PARAMETERS = ("data", "batch_size", "patch_size", "final_patch_size", "label_manager",
                         "oversample_foreground_percent", "sampling_probabilities", "pad_sides",
                         "probabilistic_oversampling", "transforms")

#: Trainer methods and attributes :func:`build_dataloaders` calls or reads.
TRAINER_MEMBERS = ("get_training_transforms", "get_validation_transforms", "get_tr_and_val_datasets",
                   "configure_rotation_dummyDA_mirroring_and_inital_patch_size", "_get_deep_supervision_scales",
                   "do_split", "save_checkpoint", "load_checkpoint", "train_step", "on_train_epoch_end")

#: Attributes of nnU-Net's loss objects that :mod:`nnunet_dro.training.losses` reads.
LOSS_ATTRIBUTES = {
    "DC_and_CE_loss": ("dc", "ce", "weight_dice", "weight_ce", "ignore_label"),
    "DC_and_BCE_loss": ("dc", "ce", "weight_dice", "weight_ce", "use_ignore_label"),
    "MemoryEfficientSoftDiceLoss": ("apply_nonlin", "smooth", "do_bg", "batch_dice"),
    "DeepSupervisionWrapper": ("loss", "weight_factors"),
}


def _unwrapped_network(trainer: nnUNetTrainer) -> torch.nn.Module:
    module = trainer.network.module if trainer.is_ddp else trainer.network
    return module._orig_mod if isinstance(module, OptimizedModule) else module


def checkpoint_contents(trainer: nnUNetTrainer) -> Dict[str, Any]:
    """The dict ``nnUNetTrainer.save_checkpoint`` writes (mirrors nnunetv2 2.8.1), for ``trainer``."""
    return {
        "network_weights": _unwrapped_network(trainer).state_dict(),
        "optimizer_state": trainer.optimizer.state_dict(),
        "grad_scaler_state": trainer.grad_scaler.state_dict() if trainer.grad_scaler is not None else None,
        "logging": trainer.logger.get_checkpoint(),
        "_best_ema": trainer._best_ema,
        "current_epoch": trainer.current_epoch + 1,
        "init_args": trainer.my_init_kwargs,
        "trainer_name": type(trainer).__name__,
        "inference_allowed_mirroring_axes": trainer.inference_allowed_mirroring_axes,
    }


def save_checkpoint_atomic(checkpoint: Dict[str, Any], filename: str) -> None:
    """``torch.save`` into a temporary file beside ``filename``, then rename: a run killed while
    saving leaves the previous checkpoint intact (nnU-Net writes in place)."""
    tmp = f"{filename}.{os.getpid()}.tmp"
    try:
        torch.save(checkpoint, tmp)
        os.replace(tmp, filename)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_checkpoint(trainer: nnUNetTrainer, filename: str) -> Dict[str, Any]:
    """``torch.load`` as ``nnUNetTrainer.load_checkpoint`` does it (onto the trainer's device)."""
    return torch.load(filename, map_location=trainer.device, weights_only=False)


def apply_checkpoint(trainer: nnUNetTrainer, checkpoint: Dict[str, Any]) -> None:
    """Restore network, optimiser, grad scaler, logger and epoch from an nnU-Net checkpoint dict
    (mirrors the body of ``nnUNetTrainer.load_checkpoint``, nnunetv2 2.8.1)."""
    own_keys = trainer.network.state_dict().keys()
    # a checkpoint written by a DDP run has 'module.' prefixes a single-process network lacks
    weights = {(k[len("module."):] if k not in own_keys and k.startswith("module.") else k): v
               for k, v in checkpoint["network_weights"].items()}
    trainer.my_init_kwargs = checkpoint["init_args"]
    trainer.current_epoch = checkpoint["current_epoch"]
    trainer.logger.load_checkpoint(checkpoint["logging"])
    trainer._best_ema = checkpoint["_best_ema"]
    trainer.inference_allowed_mirroring_axes = checkpoint.get("inference_allowed_mirroring_axes",
                                                              trainer.inference_allowed_mirroring_axes)
    _unwrapped_network(trainer).load_state_dict(weights)
    trainer.optimizer.load_state_dict(checkpoint["optimizer_state"])
    if trainer.grad_scaler is not None and checkpoint["grad_scaler_state"] is not None:
        trainer.grad_scaler.load_state_dict(checkpoint["grad_scaler_state"])


def build_dataloaders(trainer: nnUNetTrainer, make_train_loader: Callable[..., nnUNetDataLoader]) -> Tuple[Any, Any]:
    """``nnUNetTrainer.get_dataloaders`` (mirrors nnunetv2 2.8.1) with the training loader built by
    ``make_train_loader(dataset_tr, initial_patch_size, tr_transforms)``.

    Everything else is nnU-Net's: transforms, validation loader, augmenter processes (nnU-Net's
    ``nnUNet_n_proc_DA``), and the first batch of each loader drawn before training starts.
    """
    if trainer.dataset_class is None:
        trainer.dataset_class = infer_dataset_class(trainer.preprocessed_dataset_folder)
    patch_size = trainer.configuration_manager.patch_size
    deep_supervision_scales = trainer._get_deep_supervision_scales()
    (rotation_for_DA, do_dummy_2d_data_aug, initial_patch_size, mirror_axes) = \
        trainer.configure_rotation_dummyDA_mirroring_and_inital_patch_size()
    labels = trainer.label_manager
    regions = labels.foreground_regions if labels.has_regions else None
    tr_transforms = trainer.get_training_transforms(
        patch_size, rotation_for_DA, deep_supervision_scales, mirror_axes, do_dummy_2d_data_aug,
        use_mask_for_norm=trainer.configuration_manager.use_mask_for_norm, is_cascaded=trainer.is_cascaded,
        foreground_labels=labels.foreground_labels, regions=regions, ignore_label=labels.ignore_label)
    val_transforms = trainer.get_validation_transforms(
        deep_supervision_scales, is_cascaded=trainer.is_cascaded, foreground_labels=labels.foreground_labels,
        regions=regions, ignore_label=labels.ignore_label)

    dataset_tr, dataset_val = trainer.get_tr_and_val_datasets()
    dl_tr = make_train_loader(dataset_tr, initial_patch_size, tr_transforms)
    dl_val = nnUNetDataLoader(dataset_val, trainer.batch_size, patch_size, patch_size, labels,
                              oversample_foreground_percent=trainer.oversample_foreground_percent,
                              sampling_probabilities=None, pad_sides=None, transforms=val_transforms,
                              probabilistic_oversampling=trainer.probabilistic_oversampling)

    n_proc = get_allowed_n_proc_DA()
    if n_proc == 0:
        mt_gen_train, mt_gen_val = SingleThreadedAugmenter(dl_tr, None), SingleThreadedAugmenter(dl_val, None)
    else:
        pin = trainer.device.type == "cuda"
        mt_gen_train = NonDetMultiThreadedAugmenter(data_loader=dl_tr, transform=None, num_processes=n_proc,
                                                    num_cached=max(6, n_proc // 2), seeds=None, pin_memory=pin,
                                                    wait_time=0.002)
        mt_gen_val = NonDetMultiThreadedAugmenter(data_loader=dl_val, transform=None,
                                                  num_processes=max(1, n_proc // 2), num_cached=max(3, n_proc // 4),
                                                  seeds=None, pin_memory=pin, wait_time=0.002)
    # as nnU-Net: start the workers now by drawing one batch of each
    _ = next(mt_gen_train)
    _ = next(mt_gen_val)
    return mt_gen_train, mt_gen_val


def segmentation_heads(network: torch.nn.Module) -> torch.nn.ModuleList:
    """The segmentation heads of an nnU-Net network (``decoder.seg_layers``; DDP and torch.compile
    wrappers removed); a clear error for an architecture without them."""
    module = network.module if isinstance(network, torch.nn.parallel.DistributedDataParallel) else network
    module = module._orig_mod if isinstance(module, OptimizedModule) else module
    heads = getattr(getattr(module, "decoder", None), "seg_layers", None)
    if not isinstance(heads, torch.nn.ModuleList) or len(heads) == 0:
        raise RuntimeError(f"{type(module).__name__} has no decoder.seg_layers (the segmentation heads of "
                           f"dynamic_network_architectures' UNetDecoder); the GI-LS trainers need them")
    return heads


@contextmanager
def captured_head_inputs(network: torch.nn.Module) -> Iterator[List[Tuple[torch.nn.Module, torch.Tensor]]]:
    """While active, every call of a segmentation head appends ``(head, its input)`` to the yielded
    list; on exit the list is put in the order of nnU-Net's outputs (highest resolution first; the
    decoder calls the heads lowest first). The inputs keep their graph, so a loss computed from
    ``head(input + delta)`` back-propagates into the body. Only for eager networks: hooks are not
    traced by torch.compile in a way this relies on.

    >>> import torch
    >>> from dynamic_network_architectures.architectures.unet import PlainConvUNet
    >>> net = PlainConvUNet(1, 3, (4, 8, 16), torch.nn.Conv2d, 3, (1, 2, 2), 1, 2, 1, deep_supervision=True)
    >>> with captured_head_inputs(net) as captured:
    ...     outputs = net(torch.randn(1, 1, 16, 16))
    >>> [tuple(z.shape) for _, z in captured], [tuple(o.shape) for o in outputs]
    ([(1, 4, 16, 16), (1, 8, 8, 8)], [(1, 2, 16, 16), (1, 2, 8, 8)])
    >>> all(torch.equal(head(z), o) for (head, z), o in zip(captured, outputs))
    True
    """
    captured: List[Tuple[torch.nn.Module, torch.Tensor]] = []
    handles = [head.register_forward_hook(lambda module, inputs, output: captured.append((module, inputs[0])))
               for head in segmentation_heads(network)]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()
        captured.reverse()


def _parameters(function) -> List[str]:
    return list(inspect.signature(function).parameters)


def compatibility_problems() -> List[str]:
    """What in the installed nnunetv2 no longer has the shape the mirrored pieces assume (empty: all fine).

    >>> compatibility_problems()
    []
    """
    from nnunetv2.training.loss import compound_losses, deep_supervision, dice

    problems = []
    init = _parameters(nnUNetTrainer.__init__)
    if tuple(init) != TRAINER_INIT_PARAMETERS:
        problems.append(f"nnUNetTrainer.__init__{tuple(init)} != {TRAINER_INIT_PARAMETERS}: update the trainers' "
                        f"constructors and nnunet_compat")
    missing = [m for m in TRAINER_MEMBERS if not callable(getattr(nnUNetTrainer, m, None))]
    if missing:
        problems.append(f"nnUNetTrainer has no {', '.join(missing)}: update nnunet_compat.build_dataloaders")
    loader = _parameters(nnUNetDataLoader.__init__)
    missing = [p for p in DATALOADER_PARAMETERS if p not in loader]
    if missing:
        problems.append(f"nnUNetDataLoader.__init__ lacks {', '.join(missing)}: update "
                        f"nnunet_dro.training.dataloading and nnunet_compat.build_dataloaders")
    save_source = inspect.getsource(nnUNetTrainer.save_checkpoint)
    missing = [k for k in NNUNET_CHECKPOINT_KEYS if f"'{k}'" not in save_source and f'"{k}"' not in save_source]
    if missing:
        problems.append(f"nnUNetTrainer.save_checkpoint no longer writes {', '.join(missing)}: update "
                        f"nnunet_compat.checkpoint_contents / apply_checkpoint")
    from dynamic_network_architectures.building_blocks.unet_decoder import UNetDecoder
    decoder_init = inspect.getsource(UNetDecoder.__init__)
    decoder_forward = inspect.getsource(UNetDecoder.forward)
    if "self.seg_layers =" not in decoder_init or "seg_outputs[::-1]" not in decoder_forward:
        problems.append("UNetDecoder no longer keeps its heads in seg_layers, called lowest resolution first: update "
                        "nnunet_compat.captured_head_inputs (GI-LS trainers)")
    classes = {"DC_and_CE_loss": compound_losses.DC_and_CE_loss, "DC_and_BCE_loss": compound_losses.DC_and_BCE_loss,
               "MemoryEfficientSoftDiceLoss": dice.MemoryEfficientSoftDiceLoss,
               "DeepSupervisionWrapper": deep_supervision.DeepSupervisionWrapper}
    for name, attributes in LOSS_ATTRIBUTES.items():
        source = inspect.getsource(classes[name].__init__)
        missing = [a for a in attributes if f"self.{a} =" not in source and f"self.{a}=" not in source]
        if missing:
            problems.append(f"{name} no longer sets {', '.join(missing)}: update nnunet_dro.training.losses")
    return problems


def find_trainer_class(name: str, folder: str | None = None) -> type | None:
    """The class ``name`` as ``nnUNetv2_predict`` finds it: in nnunetv2's own trainers
    (``folder`` None) or in one external trainer folder (an ``nnUNet_extTrainer`` entry, its
    modules imported as top-level modules and forgotten after); None if not there.

    >>> find_trainer_class("nnUNetTrainer").__module__
    'nnunetv2.training.nnUNetTrainer.nnUNetTrainer'
    >>> find_trainer_class("NoSuchTrainer") is None
    True
    """
    if folder is None:
        import nnunetv2

        root = nnunetv2.__path__[0]
        return recursive_find_python_class(os.path.join(root, "training", "nnUNetTrainer"), name,
                                           "nnunetv2.training.nnUNetTrainer", root)
    return recursive_find_python_class(folder, name, None, base_folder=folder, cleanup_imports_from_base_folder=True)


def inference_network_inputs(plans: dict, dataset_json: dict,
                             configuration: str) -> Tuple[PlansManager, ConfigurationManager, int, int]:
    """What ``nnUNetPredictor`` hands a trainer's ``build_network_architecture``: the plans and
    configuration managers, the number of input channels and of segmentation heads."""
    plans_manager = PlansManager(plans)
    configuration_manager = plans_manager.get_configuration(configuration)
    num_inputs = determine_num_input_channels(plans_manager, configuration_manager, dataset_json)
    return (plans_manager, configuration_manager, num_inputs,
            plans_manager.get_label_manager(dataset_json).num_segmentation_heads)
