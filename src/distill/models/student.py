"""Building the student: the teacher's layers kept or dropped (`student_init`), then prepared to train (float32
master weights, activation checkpointing, LoRA)."""

from __future__ import annotations

import copy
import logging

from torch import nn

logger = logging.getLogger(__name__)

# Set on a student's (language model's) config when `student_init` cut its layers: the layer count of the pretrained
# model it was cut from. `save_pretrained` writes it to config.json, so a model distill saved and trains again (given
# as `student`) is still known to be a cut model, not a whole pretrained one (`distill.doctor.checks.learning_rate`).
CUT_FROM_LAYERS = "distill_cut_from_layers"


def parse_student_init(spec: str) -> tuple[str, list[int] | int | None]:
    """Parse `student_init` into (kind, argument); raises ValueError with the accepted forms."""
    forms = "'all', 'drop_every:K', 'keep_every:K', 'first:N' or 'layers:0,2,5'"
    kind, _, arg = spec.partition(":")
    try:
        if kind == "all" and not arg:
            return "all", None
        if kind in ("drop_every", "keep_every", "first"):
            value = int(arg)
            if value < 1 or (kind == "drop_every" and value < 2):
                raise ValueError
            return kind, value
        if kind == "layers":
            layers = [int(x) for x in arg.split(",")]
            if not layers or min(layers) < 0 or len(set(layers)) != len(layers):
                raise ValueError
            return kind, layers
    except ValueError:
        pass
    raise ValueError(f"student_init must be {forms}, got {spec!r}")


def layers_of(model: nn.Module) -> nn.ModuleList:
    """The list of transformer blocks of a decoder-only model."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(
            f"student_init: cannot find the transformer layers of {type(model).__name__} (expected "
            "model.get_decoder().layers); use student_init 'all' or pass a student model"
        )
    return layers


def select_layer_indices(num_layers: int, spec: str) -> list[int]:
    """Which of `num_layers` layers `student_init` keeps (sorted)."""
    kind, arg = parse_student_init(spec)
    if kind == "all":
        keep = list(range(num_layers))
    elif isinstance(arg, int):  # drop_every, keep_every, first
        if kind == "drop_every":
            keep = [i for i in range(num_layers) if (i + 1) % arg != 0]
        elif kind == "keep_every":
            keep = list(range(0, num_layers, arg))
        else:
            keep = list(range(min(arg, num_layers)))
    else:
        assert isinstance(arg, list)  # layers
        if max(arg) >= num_layers:
            raise ValueError(f"student_init: layer {max(arg)} does not exist (the model has {num_layers} layers)")
        keep = sorted(arg)
    if not keep:
        raise ValueError(f"student_init {spec!r} keeps no layer of {num_layers}")
    return keep


def make_student(base: nn.Module, spec: str) -> nn.Module:
    """A copy of `base` keeping the layers `spec` selects, with config and layer indices made consistent."""
    from distill.models.vision import copy_processor

    student = copy.deepcopy(base)
    copy_processor(base, student)
    layers = layers_of(student)
    keep = select_layer_indices(len(layers), spec)
    if len(keep) == len(layers):
        return student
    kept = nn.ModuleList([layers[i] for i in keep])
    decoder = student.get_decoder() if hasattr(student, "get_decoder") else student.model
    decoder.layers = kept
    for new_index, layer in enumerate(kept):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    config = _language_config(student)
    config.num_hidden_layers = len(keep)
    setattr(config, CUT_FROM_LAYERS, getattr(config, CUT_FROM_LAYERS, None) or len(layers))
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) == len(layers):
        config.layer_types = [layer_types[i] for i in keep]
    logger.info("student_init %s: kept %d of %d layers %s", spec, len(keep), len(layers), keep)
    return student


def cut_from_layers(model: nn.Module) -> int | None:
    """The layer count of the pretrained model `model` was cut from by `student_init` (in this run or in the distill
    run that saved it), or None for a model whose layers were never cut."""
    return getattr(_language_config(model), CUT_FROM_LAYERS, None)


def _language_config(model: nn.Module):
    """The config that holds the language model's layers: a vision-language model's `text_config`, else its own."""
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def prepare_student(model: nn.Module, gradient_checkpointing: bool, lora: dict | None,
                    train_vision_tower: bool = False) -> nn.Module:
    """The student as it trains: float32 master weights, activation checkpointing, LoRA adapters (`lora`:
    r, lora_alpha, lora_dropout, target_modules; None = full fine-tuning). A vision-language student trains its
    language model (and output layer) only, its vision tower and projector frozen, unless `train_vision_tower`;
    its LoRA adapters go on the language model's modules only."""
    from distill.models.vision import is_vision_language, language_module_names, language_parameters

    vision = is_vision_language(model)
    if train_vision_tower and not vision:
        raise ValueError("train_vision_tower: the student is not a vision-language model (it has no vision tower); "
                         "drop the field")
    model = model.float()
    if vision and not train_vision_tower:
        language = language_parameters(model)
        for parameter in model.parameters():
            if id(parameter) not in language:
                parameter.requires_grad_(False)
    if vision and lora is not None:
        lora = {**lora, "target_modules": language_module_names(model, list(lora["target_modules"]))}
    if gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.config.use_cache = False
    if lora is not None:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise ValueError("use_peft: true needs the optional extra: pip install peft") from None
        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
    return model
