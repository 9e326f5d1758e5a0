"""Fully sharded data parallel (FSDP2, ``torch.distributed.fsdp.fully_shard``) for a LoRA bi-encoder.

Sharding units are chosen so that no unit mixes trainable and frozen parameters: in every
transformer block the trainable leaves (the LoRA ``lora_A``/``lora_B`` layers) form one unit and
the block's frozen weights another; the same split is made for what lies outside the blocks
(embeddings, final norm). A frozen unit then never carries gradients or optimizer state, and a
trainable one holds only the adapter (peft's advice for FSDP with LoRA, there for FSDP1's
``fsdp_auto_wrap_policy``; PyTorch's FSDP2 ``fully_shard`` with a list of modules for the grouping).

Lightning runs it through :class:`LoraModelParallelStrategy` (``trainer.strategy: {class_path:
obliq.model.sharding.LoraModelParallelStrategy}``), a data-parallel
:class:`~lightning.pytorch.strategies.ModelParallelStrategy` whose checkpoints hold the whole
adapter, gathered from every rank, and not the frozen base; the LightningModule's
``configure_model`` calls :func:`shard_encoder` with the data-parallel mesh.
"""

from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The backbone's transformer blocks: modules whose class the model names in ``_no_split_modules``
    (transformers' list of blocks that must stay whole), else the children of the longest ModuleList."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if blocks:
        return blocks
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def _walk(module: nn.Module, skip: set[int]):
    """``module`` and its descendants, leaving out the subtrees of modules in ``skip`` (by id)."""
    stack = [module]
    while stack:
        m = stack.pop()
        if id(m) not in skip:
            yield m
            stack.extend(m.children())


def _split(module: nn.Module, skip: set[int]) -> tuple[list[nn.Module], bool]:
    """The modules under ``module`` (outside ``skip``) that own trainable parameters directly, and
    whether frozen ones are owned there too.

    Raises:
        ValueError: one module owns both kinds (no module-level unit can separate them).
    """
    trainable, frozen = [], False
    for m in _walk(module, skip):
        own = [p.requires_grad for p in m.parameters(recurse=False)]
        if all(own) and own:
            trainable.append(m)
        elif any(own):
            raise ValueError(
                f"{type(m).__name__} owns trainable and frozen parameters: FSDP cannot shard "
                "them in separate units; freeze or unfreeze the whole module"
            )
        frozen |= bool(own) and not any(own)
    return trainable, frozen


def shard_encoder(encoder: nn.Module, mesh, mp_policy=None) -> list[tuple[str, int]]:
    """Apply ``fully_shard`` bottom-up: per block, its trainable leaves then the block; then the rest.

    Args:
        encoder: the :class:`~obliq.model.BiEncoder` (or any module holding a transformers model).
        mesh: the data-parallel :class:`~torch.distributed.device_mesh.DeviceMesh` (1-D).
        mp_policy: an FSDP2 ``MixedPrecisionPolicy`` (None: the parameters' own dtype).

    Returns:
        The units in the order made: ``(kind, parameter count)``, kind ``trainable`` or ``frozen``.

    Raises:
        ValueError: the encoder has no parameter, or a module owns both trainable and frozen
            parameters (LoRA never does: its weights live in their own ``nn.Linear``).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs = {"mesh": mesh, "mp_policy": mp_policy or MixedPrecisionPolicy()}
    units: list[tuple[str, int]] = []
    done: set[int] = set()  # modules already in a unit (by id)

    def unit(modules: list[nn.Module] | nn.Module, kind: str) -> None:
        group = modules if isinstance(modules, list) else [modules]
        count = sum(p.numel() for g in group for m in _walk(g, done) for p in m.parameters(recurse=False))
        fully_shard(modules, **kwargs)
        done.update(id(m) for m in group)
        units.append((kind, count))

    if not any(True for _ in encoder.parameters()):
        raise ValueError("shard_encoder: the encoder has no parameter")
    for block in reversed(_blocks(encoder)):  # inner blocks before outer ones (bottom-up)
        trainable, frozen = _split(block, done)
        if trainable and frozen:
            unit(trainable, "trainable")
        unit(block, "trainable" if trainable and not frozen else "frozen")
    trainable, frozen = _split(encoder, done)
    if trainable and frozen:
        unit(trainable, "trainable")
    unit(encoder, "trainable" if trainable and not frozen else "frozen")
    return units


class LoraModelParallelStrategy(ModelParallelStrategy):
    """Lightning's FSDP2 strategy whose checkpoints hold the whole trainable state, gathered.

    Lightning's :class:`~lightning.pytorch.strategies.ModelParallelStrategy` writes either one shard
    file per rank or, with ``save_distributed_checkpoint=False``, the full model gathered onto rank 0
    — a LoRA run would then gather the frozen 3B base at every save. This subclass writes one file
    (rank 0) with the full, unsharded trainable parameters only (``ignore_frozen_params``) and the
    full optimizer state, so a checkpoint is the whole adapter whatever the world size (an exact
    resume still needs the same world size: obliq's data stream is sharded by rank). Args are those
    of the parent; ``save_distributed_checkpoint`` is fixed to False.
    """

    def __init__(self, data_parallel_size="auto", tensor_parallel_size=1, **kwargs):
        kwargs["save_distributed_checkpoint"] = False
        super().__init__(data_parallel_size=data_parallel_size, tensor_parallel_size=tensor_parallel_size, **kwargs)

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":  # parent's default is the node count (2-D meshes)
            self._data_parallel_size = self.num_processes * self.num_nodes
        super().setup_environment()

    def lightning_module_state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        return get_model_state_dict(self.model, options=options)

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        """Load as the parent does, after checking that the file holds every trainable weight (the
        parent loads non-strictly, since the frozen base is not in the file)."""
        from obliq.model.checkpoint import read_checkpoint

        state = read_checkpoint(checkpoint_path)["state_dict"]  # as data: weights_only, whatever was asked
        check = getattr(self.lightning_module, "check_checkpoint_state", None)
        if check is not None:
            check(state)
        return super().load_checkpoint(checkpoint_path, weights_only=True)
