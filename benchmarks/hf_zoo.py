"""Tiny random-weight Hugging Face models for coverage sweeps and tests.

Why this module exists: the backend has to be judged on real architectures,
not only on the hand-written models of ``tests/models.py``, and the full-size
configs are too big to build, let alone compile, on a CPU runner. Here every
architecture in transformers' auto registries is shrunk *generically* from its
config class defaults (widths, layer counts, vocabularies, image and audio
sizes) so that ``benchmarks/models.py`` can sweep them all and
``tests/test_hf_models.py`` can pin a representative few. Nothing is
downloaded: configs come from ``AutoConfig.for_model`` and weights from
``from_config`` under a fixed seed.

Nothing here special-cases an architecture. When shrinking breaks a model,
the builder falls back to a milder tier (full image and audio sizes, fewer
layers only, then the default config) as long as the model stays under
:data:`MAX_PARAMS`; callers choose which candidate inputs work by running
them in eager.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any, Callable, Iterator, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

HEADS = ("base", "causal_lm")
MAX_PARAMS = 30_000_000
"""Largest model any tier may build: keeps one sweep process well under a minute."""
BATCH = 2
SEQ = 16
DECODER_SEQ = 8
AUDIO_SAMPLES = 3200
"""Raw-waveform length: ten frames after the usual 320x convolutional downsampling."""
DEFAULT_IMAGE = 64
"""Image side for models whose config names none (convnets downsample by 32)."""

HIDDEN = 64
HEAD_COUNT = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEAD_COUNT
FFN = 128
LAYERS = 2
VOCAB = 1024
EXPERTS = 4

_HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "dim", "model_dim")
_HEAD_KEYS = (
    "num_attention_heads", "n_head", "n_heads", "num_heads",
    "encoder_attention_heads", "decoder_attention_heads",
)
_KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
_HEAD_DIM_KEYS = ("head_dim", "attention_head_dim", "d_kv")
_LAYER_KEYS = (
    "num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers",
    "decoder_layers", "num_encoder_layers", "num_decoder_layers",
)
_FFN_KEYS = (
    "intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner",
    "d_ff", "mlp_dim", "moe_intermediate_size", "shared_expert_intermediate_size",
)
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k", "moe_k")
_SMALL_POSITIONS = ("max_source_positions",)
"""Audio encoders whose input length is tied to this (Whisper wants 2x frames)."""


@dataclasses.dataclass
class Built:
    """A tiny model ready to run, plus how it was obtained."""

    model: torch.nn.Module
    config: Any
    tier: str
    """Which of :data:`TIERS` worked."""
    attn_implementation: str
    num_params: int


class BuildError(Exception):
    """No tier produced a buildable model; the message says why for each."""


def architectures(heads: tuple[str, ...] = HEADS) -> list[tuple[str, str]]:
    """Every (model_type, head) in transformers' auto registries, in registry order."""
    from transformers.models.auto import modeling_auto

    mappings = {
        "base": modeling_auto.MODEL_MAPPING_NAMES,
        "causal_lm": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    }
    return [(model_type, head) for head in heads for model_type in mappings[head]]


def _auto_class(head: str) -> Any:
    import transformers

    return {"base": transformers.AutoModel, "causal_lm": transformers.AutoModelForCausalLM}[head]


# ---------------------------------------------------------------- configs


def _is_config(value: Any) -> bool:
    from transformers import PreTrainedConfig

    return isinstance(value, PreTrainedConfig)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _attrs(config: Any) -> dict[str, Any]:
    """The config's own attributes (not the aliases of ``attribute_map``)."""
    return {k: v for k, v in vars(config).items() if not k.startswith("_")}


def _no_randomness(attrs: dict[str, Any]) -> dict[str, Any]:
    """Zero every dropout-like probability: training must be deterministic to
    compare eager with compiled (random ops run eagerly, but a different call
    order would still draw different numbers)."""
    markers = ("dropout", "drop_path", "layerdrop", "drop_rate", "pdrop", "_prob")
    return {
        k: 0.0
        for k, v in attrs.items()
        if isinstance(v, float) and any(m in k for m in markers)
    }


def _layer_overrides(attrs: dict[str, Any]) -> dict[str, Any]:
    """Layer counts -> :data:`LAYERS`, slicing per-layer string lists (``layer_types``).

    A count that equals the length of a non-string list (Swin's ``depths``,
    a backbone's stage names) describes stages, not repeated layers; it stays.
    """
    out: dict[str, Any] = {}
    for key in _LAYER_KEYS:
        count = attrs.get(key)
        if not _int(count) or count <= LAYERS:
            continue
        same_length = [k for k, v in attrs.items() if isinstance(v, (list, tuple)) and len(v) == count]
        if any(not all(isinstance(x, str) for x in attrs[k]) for k in same_length):
            continue
        kept = _kept_layers(count, [attrs[k] for k in same_length])
        if len(kept) >= count:
            continue
        out[key] = len(kept)
        out.update({k: [attrs[k][i] for i in kept] for k in same_length})
    return out


def _kept_layers(count: int, kinds: list[Any]) -> list[int]:
    """Indices of the layers to keep: the first :data:`LAYERS`, plus the first of
    every other layer kind (hybrid models need an attention layer next to their
    linear-attention or Mamba ones)."""
    kept = set(range(min(LAYERS, count)))
    for per_layer in kinds:
        first: dict[str, int] = {}
        for index, kind in enumerate(per_layer):
            first.setdefault(kind, index)
        kept.update(first.values())
    return sorted(kept)


def _token_overrides(attrs: dict[str, Any], vocab: int) -> dict[str, Any]:
    """Special token ids outside a shrunk vocabulary move to its top end.

    Distinct ids stay distinct (pad must not become eos), and the mapping is
    shared by every ``*_token_id``/``*_token_index`` attribute.
    """
    keys = [k for k in attrs if k.endswith(("token_id", "token_ids", "token_index"))]
    big = sorted(
        {i for k in keys for i in (attrs[k] if isinstance(attrs[k], list) else [attrs[k]]) if _int(i) and i >= vocab}
    )
    remap = {old: vocab - 1 - n for n, old in enumerate(big)}
    out: dict[str, Any] = {}
    for key in keys:
        value = attrs[key]
        if _int(value) and value in remap:
            out[key] = remap[value]
        elif isinstance(value, list) and any(_int(i) and i in remap for i in value):
            out[key] = [remap.get(i, i) if _int(i) else i for i in value]
    return out


def _image_size(size: int, patch: Any) -> int:
    """The smallest of 32/64 the patch size divides (keeps at least 4 patches)."""
    patch = patch[0] if isinstance(patch, (list, tuple)) and patch else patch
    for side in (32, 64):
        if not _int(patch) or (side % patch == 0 and side // patch >= 2):
            return min(side, size)
    return size


def _cap(attrs: dict[str, Any], out: dict[str, Any], keys: Any, limit: int) -> None:
    """Set ``out[key] = limit`` for each integer attribute in ``keys`` above it."""
    for key in keys:
        if _int(attrs.get(key)) and attrs[key] > limit:
            out[key] = limit


def _width_overrides(attrs: dict[str, Any]) -> dict[str, Any]:
    """Widths, heads, FFN, vocabulary, experts, image and audio sizes."""
    out: dict[str, Any] = {}
    heads_list = attrs.get("num_heads")
    hidden = HIDDEN
    if isinstance(heads_list, (list, tuple)) and heads_list and _int(heads_list[0]):
        # Hierarchical models (Swin): widths double per stage with the heads,
        # so a width of 16 per head in the first stage keeps every stage divisible.
        hidden = HEAD_DIM * heads_list[0]
    _cap(attrs, out, _HIDDEN_KEYS, hidden)
    _cap(attrs, out, _HEAD_KEYS, HEAD_COUNT)
    heads = next((attrs[k] for k in _HEAD_KEYS if _int(attrs.get(k))), None)
    for key in _KV_HEAD_KEYS:
        if _int(attrs.get(key)) and attrs[key] > KV_HEADS:
            # Multi-head models (kv == heads) stay multi-head; GQA ones get 2 groups.
            out[key] = min(HEAD_COUNT, heads or HEAD_COUNT) if attrs[key] == heads else KV_HEADS
    _cap(attrs, out, _HEAD_DIM_KEYS, HEAD_DIM)
    _cap(attrs, out, _FFN_KEYS, FFN)
    _cap(attrs, out, _EXPERT_KEYS, EXPERTS)
    _cap(attrs, out, _TOP_K_KEYS, 2)
    _cap(attrs, out, ("n_group", "topk_group", "n_shared_experts"), 1)
    _cap(attrs, out, _SMALL_POSITIONS, 64)
    for key, value in attrs.items():
        # Per-head sizes under other names (rotary_dim, qk_rope_head_dim,
        # v_head_dim) and low-rank projections must shrink with the heads.
        if not _int(value):
            continue
        if key.endswith(("head_dim", "rotary_dim")) and value > HEAD_DIM:
            out[key] = HEAD_DIM
        elif key.endswith("lora_rank") and value > 2 * HEAD_DIM:
            out[key] = 2 * HEAD_DIM
    if _int(attrs.get("projection_dim")) and attrs["projection_dim"] > 32:
        out["projection_dim"] = 32
    if isinstance(attrs.get("hidden_sizes"), (list, tuple)):
        out["hidden_sizes"] = [max(16, v // 8) if _int(v) else v for v in attrs["hidden_sizes"]]
    if isinstance(attrs.get("depths"), (list, tuple)):
        out["depths"] = [min(v, 1) if _int(v) else v for v in attrs["depths"]]
    if isinstance(attrs.get("conv_dim"), (list, tuple)):
        out["conv_dim"] = [min(v, 32) if _int(v) else v for v in attrs["conv_dim"]]
    size = attrs.get("image_size")
    if _int(size) and size > 64:
        out["image_size"] = _image_size(size, attrs.get("patch_size"))
    elif isinstance(size, (list, tuple)) and len(size) == 2 and all(_int(s) for s in size) and max(size) > 64:
        side = _image_size(min(size), attrs.get("patch_size"))
        out["image_size"] = [side, side]
    vocab = attrs.get("vocab_size")
    if _int(vocab) and vocab > VOCAB:
        out["vocab_size"] = VOCAB
        out.update(_token_overrides(attrs, VOCAB))
    return out


def _overrides(config: Any, tier: str) -> dict[str, Any]:
    """Keyword overrides for ``type(config)`` at ``tier``, sub-configs included
    (as full dicts, so a composite config keeps its own sub-config defaults)."""
    attrs = _attrs(config)
    out = _no_randomness(attrs)
    if tier != "default":
        out.update(_layer_overrides(attrs))
    if tier.startswith("shrunk"):
        out.update(_width_overrides(attrs))
    if tier == "shrunk-full-size":
        for key in ("image_size", *_SMALL_POSITIONS):
            out.pop(key, None)
    for key, value in attrs.items():
        if _is_config(value):
            sub = value.to_dict()
            # Derived sizes (head_dim = hidden // heads) are recomputed from the
            # overrides, not carried over stale from the defaults' to_dict().
            if tier.startswith("shrunk") and "head_dim" in sub and _int(sub["head_dim"]):
                sub["head_dim"] = HEAD_DIM
            sub.update(_overrides(value, tier))
            out[key] = sub
    return out


def make_config(model_type: str, tier: str = "shrunk") -> Any:
    """The config of ``model_type`` at ``tier`` (one of :data:`TIERS`)."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    return AutoConfig.for_model(model_type, **_overrides(default, tier))


def _count_params(head: str, config: Any) -> int:
    """Parameters of the model, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = _auto_class(head).from_config(config)
    return sum(p.numel() for p in model.parameters())


TIERS = ("shrunk", "shrunk-full-size", "fewer-layers", "default")
"""From the most to the least shrunk. ``shrunk-full-size`` keeps the default
image and audio lengths: windowed or strided models (Swin) tie them to
their window sizes and stage counts."""


def build_candidates(model_type: str, head: str, seed: int = 0) -> Iterator[Built]:
    """Buildable tiny models of ``model_type`` from the most to the least shrunk.

    The caller takes the first one whose eager run works. Raises
    :class:`BuildError` (after the last tier) with every tier's reason when
    none could be built at all.
    """
    reasons = []
    built_any = False
    for tier in TIERS:
        try:
            config = make_config(model_type, tier)
            params = _count_params(head, config)
            if params > MAX_PARAMS:
                reasons.append(f"{tier}: {params / 1e6:.0f}M params > cap")
                continue
            model, attn = _instantiate(head, config, seed)
        except Exception as exc:
            reasons.append(f"{tier}: {type(exc).__name__}: {first_line(exc)}")
            continue
        built_any = True
        yield Built(model, config, tier, attn, params)
    if not built_any:
        raise BuildError("; ".join(reasons))


class NoEagerInput(Exception):
    """A model was built, but eager runs none of its candidate inputs."""


def first_eager_run(model_type: str, head: str, labels: bool = False) -> tuple[Built, dict[str, Any], Any]:
    """The first tiny model (:func:`build_candidates`) and candidate input
    (:func:`input_candidates`) that eager runs, with eager's output (no grad).

    Raises :class:`BuildError` when nothing builds and :class:`NoEagerInput`
    (naming the first eager error) when no input runs."""
    errors = []
    for built in build_candidates(model_type, head):
        for inputs in input_candidates(built.model, built.config, labels=labels):
            try:
                with torch.no_grad():
                    return built, inputs, built.model(**inputs)
            except Exception as exc:  # noqa: BLE001 - try the next candidate
                errors.append(f"{type(exc).__name__}: {first_line(exc)}")
    raise NoEagerInput(errors[0] if errors else "no candidate input")


def _instantiate(head: str, config: Any, seed: int) -> tuple[torch.nn.Module, str]:
    """The model with SDPA attention, or eager attention when SDPA is unsupported."""
    errors = []
    for attn in ("sdpa", "eager"):
        torch.manual_seed(seed)
        try:
            model = _auto_class(head).from_config(config, attn_implementation=attn)
        except Exception as exc:
            errors.append(exc)
            continue
        _break_constant_parameters(model, seed)
        return model.float().eval(), attn
    raise errors[-1]


def _break_constant_parameters(model: torch.nn.Module, seed: int) -> None:
    """Add small noise to parameters initialised to one constant.

    A zero-initialised router scores every expert the same, and topk over
    exact ties has no defined order (eager's CPU kernel picked experts 2, 3
    where XLA picked 0, 1 in afmoe): a difference of implementation, not of
    results, that real weights never produce.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.numel() > 1 and param.is_floating_point() and bool((param == param.flatten()[0]).all()):
                param.add_(torch.randn(param.shape, generator=generator).to(param.dtype) * 0.02)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


# ---------------------------------------------------------------- inputs


def _forward_params(model: torch.nn.Module) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def _sub(config: Any, name: str) -> Any:
    """The first of ``config`` and its sub-configs that has attribute ``name``."""
    if getattr(config, name, None) is not None:
        return config
    for value in _attrs(config).values():
        if _is_config(value):
            found = _sub(value, name)
            if found is not None:
                return found
    return None


def _special_ids(config: Any) -> set[int]:
    ids: set[int] = set()
    for key, value in _attrs(config).items():
        if key.endswith(("token_id", "token_ids", "token_index")):
            ids.update(i for i in (value if isinstance(value, list) else [value]) if _int(i))
        elif _is_config(value):
            ids |= _special_ids(value)
    return ids


def _token_ids(config: Any, shape: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    """Random ids that avoid special tokens (an image token would demand pixels)."""
    holder = _sub(config, "vocab_size")
    vocab = holder.vocab_size if holder is not None else VOCAB
    special = _special_ids(config)
    allowed = torch.tensor([i for i in range(min(vocab, VOCAB)) if i not in special] or [0])
    return allowed[torch.randint(len(allowed), shape, generator=generator)]


def _pixels(config: Any, generator: torch.Generator) -> torch.Tensor:
    holder = _sub(config, "image_size")
    size = holder.image_size if holder is not None else DEFAULT_IMAGE
    side = size if _int(size) else (size[0] if isinstance(size, (list, tuple)) else DEFAULT_IMAGE)
    channels_holder = _sub(config, "num_channels")
    channels = channels_holder.num_channels if channels_holder is not None else 3
    return torch.randn(BATCH, channels, side, side, generator=generator)


def _audio_features(config: Any, generator: torch.Generator) -> list[torch.Tensor]:
    """Spectrogram candidates: (batch, mel, frames) then (batch, frames, features)."""
    out = []
    mel = _sub(config, "num_mel_bins")
    if mel is not None:
        positions = getattr(mel, "max_source_positions", None)
        frames = 2 * positions if _int(positions) else 64
        out.append(torch.randn(BATCH, mel.num_mel_bins, frames, generator=generator))
    for name in ("input_feat_per_channel", "feature_size", "num_mel_bins", "input_dim"):
        holder = _sub(config, name)
        if holder is not None and _int(getattr(holder, name)):
            channels = getattr(holder, "input_channels", 1)
            features = getattr(holder, name) * (channels if _int(channels) else 1)
            out.append(torch.randn(BATCH, _frames(holder), features, generator=generator))
    return out


def _frames(config: Any) -> int:
    """Spectrogram frames: the config's fixed input length where it names one."""
    length = getattr(config, "max_length", None)
    return length if _int(length) and 16 <= length <= 4096 else 64


def input_candidates(model: torch.nn.Module, config: Any, seed: int = 0, labels: bool = False) -> Iterator[dict[str, Any]]:
    """Input dicts to try in order; the first that runs in eager is the one to use.

    First the model's main input (with the attention mask and decoder ids it
    accepts), then the main input plus every other standard input the forward
    takes (CLIP-like models want text and pixels together).
    """
    generator = torch.Generator().manual_seed(seed)
    params = _forward_params(model)
    main = getattr(model, "main_input_name", "input_ids")
    ids = _token_ids(config, (BATCH, SEQ), generator)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, -4:] = 0  # right padding in the second row exercises the masking path
    extras: dict[str, Any] = {}
    if "attention_mask" in params and main == "input_ids":
        extras["attention_mask"] = mask
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        extras["decoder_input_ids"] = _token_ids(config, (BATCH, DECODER_SEQ), generator)
    if labels:
        extras["labels"] = ids

    mains: list[Any]
    if main == "input_ids":
        mains = [ids]
    elif main == "pixel_values":
        mains = [_pixels(config, generator)]
    elif main == "input_values":
        # A raw waveform, else a spectrogram (AST names its input input_values too).
        mains = [torch.randn(BATCH, AUDIO_SAMPLES, generator=generator), *_audio_features(config, generator)]
    elif main == "input_features":
        mains = _audio_features(config, generator)
    else:
        mains = []
    for value in mains:
        yield {main: value, **extras}
    if main != "input_ids" and "input_ids" in params:
        base = {"input_ids": ids, **({"attention_mask": mask} if "attention_mask" in params else {}), **extras}
        if "pixel_values" in params:
            yield {**base, "pixel_values": _pixels(config, generator)}
        yield base
    elif main == "input_ids" and "pixel_values" in params:
        yield {"input_ids": ids, "pixel_values": _pixels(config, generator), **extras}


# ---------------------------------------------------------------- outputs


def float_tensors(value: Any, prefix: str = "out", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every floating tensor in a model output, with a path name.

    Flattens ModelOutput/dicts, tuples/lists and transformers' cache objects
    (their tensors live in attributes); anything else is not a tensor result.
    """
    if depth > 6 or value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield prefix, value
    elif isinstance(value, dict):  # ModelOutput is an OrderedDict of its non-None fields
        for key, item in value.items():
            yield from float_tensors(item, f"{prefix}.{key}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from float_tensors(item, f"{prefix}[{index}]", depth + 1)
    elif type(value).__module__.startswith("transformers.cache") or hasattr(value, "layers"):
        for key, item in vars(value).items():
            yield from float_tensors(item, f"{prefix}.{key}", depth + 1)


def _matching_tensors(expected: Any, actual: Any) -> tuple[list[str], list[tuple[str, torch.Tensor, torch.Tensor]]]:
    """The floating tensors of two model outputs paired by path, (name,
    expected, actual), after the problems that leave a tensor unpaired: one
    missing under tpu, or of another shape."""
    want = dict(float_tensors(expected))
    got = dict(float_tensors(actual))
    problems = [f"{name}: missing under tpu" for name in want if name not in got]
    pairs = []
    for name, tensor in want.items():
        other = got.get(name)
        if other is None:
            continue
        if other.shape != tensor.shape:
            problems.append(f"{name}: shape {tuple(other.shape)} != {tuple(tensor.shape)}")
            continue
        pairs.append((name, tensor.detach(), other.detach().to(tensor.device, tensor.dtype)))
    return problems, pairs


def compare(expected: Any, actual: Any, rtol: float = 1e-4, atol: float = 1e-4) -> list[str]:
    """Mismatch descriptions (empty when every floating tensor matches)."""
    problems, pairs = _matching_tensors(expected, actual)
    for name, tensor, other in pairs:
        if not torch.allclose(other, tensor, rtol=rtol, atol=atol, equal_nan=True):
            diff = (other - tensor).abs().nan_to_num(float("inf")).max().item()
            problems.append(f"{name}: max abs diff {diff:.3g}")
    return problems


def cast_floats(tree: Any, dtype: torch.dtype) -> Any:
    """``tree`` (inputs, outputs) with its floating tensors in ``dtype``."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, tree)


def compare_against_float64(expected: Any, actual: Any, float64: Any, tol: float) -> tuple[list[str], dict[str, float]]:
    """Mismatch descriptions for a half-precision run (empty when every floating
    tensor passes): each tensor against the same model run in float64 (or
    float32, where a kernel has no float64) by PyTorch's own accuracy check for
    Inductor's benchmarks, held relative where eager resolves the tensor
    (``sweep_common.judge_against_exact``). Elementwise tolerances cannot judge
    a whole model in bfloat16: eager's and the device's roundings differ in
    order, and either can land an element several ulps from the other while
    both stay as near float64 overall.

    Also, per tensor eager resolves (and does not compute exactly), the
    device's error against the float64 run over eager's (1.0: as near as eager)."""
    from benchmarks.sweep_common import judge_against_exact

    problems, pairs = _matching_tensors(expected, actual)
    reference = dict(float_tensors(float64))
    ratios = {}
    for name, tensor, other in pairs:
        exact = reference.get(name)
        if exact is None:
            continue
        judgement = judge_against_exact(tensor, other, exact, tol)
        if judgement.problem is not None:
            problems.append(f"{name}: {judgement.problem}")
        if judgement.resolved and judgement.eager_error > 0:
            ratios[name] = judgement.device_error / judgement.eager_error
    return problems, ratios


def train_step(model: torch.nn.Module, inputs: dict[str, Any], call: Optional[Callable[..., Any]] = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One SGD step on ``labels``: returns the loss and every parameter gradient."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    output = (model if call is None else call)(**inputs)
    loss = output["loss"] if isinstance(output, dict) else output[0]
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    return loss.detach(), grads
