"""Loading models: a named model (the demos), a local folder (pruned by headprune or not), or a Hugging Face hub id.

Named models are registered with :func:`register_model` by the packages that build them (``headprune.demos``
registers "demo", "demo-lm" and "demo-circuit" when ``headprune`` is imported), so this module never imports a
demo. No code from a user's files runs: ``trust_remote_code=False`` always, safetensors preferred, and a remote-code
model (an ``auto_map`` in its config, .py files in its folder) is refused by name. Before any weight loads, the
config is checked (heads dividing the hidden size), the architecture is adapted on the meta device
(``UnsupportedArchitecture`` and family refusals cost no waiting) and a safetensors checkpoint's tensor shapes are
compared with the config's. A folder saved by
``save_pruned`` records its kept heads in its config; it is rebuilt at full size, cut by surgery to the same
shape, and then the saved weights are loaded strictly.
"""

from __future__ import annotations

import json
import pickle
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import dispatch_model, infer_auto_device_map, init_empty_weights
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightRenaming, apply_renamings

from ..errors import DeviceError, ModelLoadError, UnsupportedArchitecture, UntrainedHeadError
from ..userinput import (
    MAX_JSON_DEPTH,
    exists,
    is_dir,
    is_file,
    json_depth,
    kind_of,
    parse_user_json,
    read_user_text,
    user_path,
)
from .arch import ModelAdapter, adapt, supported
from .device import OFFLOAD_HELP, input_device, parse_device_map, parse_dtype, resolve_device
from .layers import DROPPED_LAYERS_KEY, drop_layers
from .surgery import apply_layout, plan_block, record_kept_heads
from .tokenizer import prepare_tokenizer


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: object
    spec: str               # what the user asked for ("demo", a path, a hub id)
    source: str             # resolved location
    adapter: ModelAdapter
    device: torch.device
    # weights of the task head that the checkpoint lacked, so transformers initialised them at random on load
    # (a base or ...ForMaskedLM checkpoint read as a classifier); empty for a trained head (``check_head``)
    untrained_head: list[str] = field(default_factory=list)

    @property
    def id2label(self) -> dict[int, str]:
        return {int(k): str(v) for k, v in self.model.config.id2label.items()}


# -- named models ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NamedModel:
    """A model known by name: ``build(progress)`` returns its folder, building it first when needed."""

    name: str
    description: str
    build: Callable[..., Path]
    causal: bool | None = None      # a decoder (True) or an encoder (False), known before it is built; None: unsaid


NAMED_MODELS: dict[str, NamedModel] = {}


def register_model(name: str, description: str, build: Callable[..., Path], causal: bool | None = None) -> None:
    """Make ``load_model(name)`` load the folder ``build(progress=None)`` returns (built once, then cached).
    ``causal``: whether it is a decoder, so commands that need one refuse an encoder before building it."""
    NAMED_MODELS[name] = NamedModel(name, description, build, causal)


# model types of the encoder families headprune adapts (``arch.encoders`` / ``arch.modern``)
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "deberta",
                           "deberta-v2", "modernbert"})


def declared_causal(spec: str) -> bool | None:
    """Whether ``spec`` names a decoder, read without loading weights: a named model's declaration, else a
    folder's ``config.json`` (``model_type``); None when nothing says (a hub id: checked once loaded)."""
    if spec in NAMED_MODELS:
        return NAMED_MODELS[spec].causal
    config = folder_config(Path(spec).expanduser())
    if config is None:
        return None
    model_type = (config.get("text_config") or {}).get("model_type") or config.get("model_type")
    return None if not model_type else model_type not in ENCODER_TYPES


def model_source_kind(spec: str) -> str:
    """What ``spec`` names: "named" (a registered model), "folder" (an existing path, or one written as a path)
    or "hub" (a Hugging Face id such as ``org/name``)."""
    if spec in NAMED_MODELS:
        return "named"
    parts = spec.split("/")
    hub_like = len(parts) <= 2 and all(p and not p.startswith(".") for p in parts) and not spec.startswith(("/", "~"))
    return "hub" if hub_like and not exists(spec) else "folder"


def model_folder(spec: str) -> Path | None:
    """The folder a named model or a local folder ``spec`` loads from (a named one is built first), without
    loading it; None for a hub id."""
    if spec in NAMED_MODELS:
        return Path(NAMED_MODELS[spec].build())
    if model_source_kind(spec) == "folder":
        return Path(user_path(spec, "--model", "a model folder", ModelLoadError))
    return None


def peek_config(spec: str) -> dict | None:
    """config.json of a named model or local folder, read without loading the model (None for a hub id)."""
    folder = model_folder(spec)
    return None if folder is None else folder_config(folder)


def folder_config(folder: Path) -> dict | None:
    """A folder's config.json, the one reader of it before weights load: None when it is missing or not JSON
    (load_model names the problem); ModelLoadError when it is JSON but not a configuration."""
    refuse_code_files(folder)
    config = read_config_json(folder)
    if config is None:
        return None   # load_model names the problem
    if isinstance(config, dict) and config.get("auto_map"):
        raise ModelLoadError(remote_code_message(str(folder), "its config.json has an 'auto_map' (classes in the "
                                                 f"folder's own .py files: {', '.join(sorted(config['auto_map']))})"))
    architectures = config.get("architectures") or [] if isinstance(config, dict) else None
    text_config = config.get("text_config") or {} if isinstance(config, dict) else None
    model_types = [c.get("model_type") for c in (config, text_config) if isinstance(c, dict)]
    if (not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures)
            or not isinstance(text_config, dict) or any(m is not None and not isinstance(m, str) for m in model_types)):
        raise ModelLoadError(f"{folder / 'config.json'} is not a model configuration: a config.json is a JSON "
                             "object whose 'architectures' (if any) is a list of class names, whose 'model_type' "
                             "(if any) is a name and whose 'text_config' (if any) is an object, as save_pretrained "
                             "writes it.")
    return config


def read_config_json(folder: Path):
    """The JSON in ``folder``'s config.json through the one safe reader (a FIFO, a device such as /dev/zero, a file
    over ``MAX_FILE_BYTES`` or JSON nested past ``MAX_JSON_DEPTH`` is a ModelLoadError before it is read); None when
    there is none or it is not JSON (load_model names the problem)."""
    path = folder / "config.json"
    if kind_of(path) in ("missing", "unreadable", "dir"):
        return None
    accepted = "a config.json as save_pretrained writes it"
    text = read_user_text(path, "The model's config.json", accepted, error=ModelLoadError)
    if json_depth(text) > MAX_JSON_DEPTH:   # named here: parsing it would be a RecursionError
        parse_user_json(text, str(path), accepted, error=ModelLoadError)
    try:
        return json.loads(text)
    except ValueError:
        return None


def remote_code_message(spec: str, why: str) -> str:
    return (f"{spec} is a remote-code model: {why}. headprune runs no code from a user's files (it loads models "
            "with trust_remote_code=False), so it cannot load it. Accepted: a model of a family transformers itself "
            "implements (a config.json without 'auto_map', no .py files in the folder); headprune's families are: "
            f"{supported()}.")


def refuse_code_files(folder: Path) -> None:
    """Refuse a model folder that ships Python files (a remote-code model's modeling code): none of it would run
    here, and a model that needs it cannot be built without it."""
    try:
        code = sorted(p.name for p in folder.glob("*.py"))
    except OSError:
        return
    if code:
        raise ModelLoadError(remote_code_message(str(folder), f"the folder holds Python code ({', '.join(code[:3])})"))


def check_head_split(config, raw: dict | None = None) -> None:
    """Refuse a config whose attention heads do not divide its hidden size where the family derives the head size
    as hidden / heads (no explicit ``head_dim``): the model could not be built as described, or its weights would
    not fit it. ``raw``: the config.json as written (an explicit head_dim there is the family's own choice)."""
    config = getattr(config, "text_config", None) or config
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    raw = (raw or {}).get("text_config") or raw or {}
    if "head_dim" in raw or not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0:
        return
    if hidden % heads:
        raise ModelLoadError(f"The config's hidden size {hidden} is not a multiple of its {heads} attention heads "
                             f"({hidden / heads:g} features per head). Accepted: a config whose hidden size is a "
                             "multiple of num_attention_heads (or one that sets head_dim explicitly, where its "
                             "family reads it).")


def shell_model(config):
    """The model of ``config`` with every parameter on the meta device: its shapes, no memory, no weights."""
    with init_empty_weights(include_buffers=False):
        return auto_class(config).from_config(config, trust_remote_code=False)


def check_before_weights(spec: str, config, folder: Path | None, raw: dict | None) -> ModelAdapter | None:
    """What can be refused from the config alone, before a weight loads: heads that do not divide the hidden size,
    an architecture headprune does not adapt (``UnsupportedArchitecture``, built on the meta device), and a
    safetensors checkpoint whose tensors do not fit the config (shapes read from the file headers). ``raw``: the
    ``folder``'s config.json as ``load_model`` read it (``folder_config``)."""
    check_head_split(config, raw if folder is not None else config.to_dict())
    try:
        shell = shell_model(config)
    except (ValueError, AssertionError, TypeError) as exc:
        raise ModelLoadError(f"{spec}: its config does not describe a model transformers can build: {exc}") from exc
    except Exception:  # noqa: BLE001 - e.g. a quantisation library's own check: loading itself says what it is
        return None
    adapter = adapt(shell)
    if folder is not None:
        _check_checkpoint_shapes(spec, shell, folder)
    return adapter


def _check_checkpoint_shapes(spec: str, shell: nn.Module, folder: Path) -> None:
    expected = {name: tuple(p.shape) for name, p in shell.state_dict().items()}
    found = {}
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), "pt") as f:   # the header only: no tensor is read
                found.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
        except (OSError, SafetensorError):
            return   # load_model names an unreadable file
    prefix = getattr(shell, "base_model_prefix", "") or ""
    wrong = []
    for name, shape in _model_names(shell, found).items():
        target = expected.get(name, expected.get(f"{prefix}.{name}") if prefix else None)
        if target is not None and target != shape:
            wrong.append((name, shape, target))
    check_weight_shapes(spec, wrong)


def declared_model(spec: str) -> nn.Module | None:
    """``spec``'s model built from its config alone, on the meta device (shapes, no weights, no memory), so a path
    its family cannot take is refused before any weight loads; None when only loading can tell (a hub id, a folder
    without a readable config, a saved pruned model) or the config cannot be built (load_model names why)."""
    raw = peek_config(spec)
    if raw is None or raw.get("headprune_kept_heads") or "model_type" not in raw:
        return None
    try:
        return shell_model(AutoConfig.for_model(**raw))
    except Exception:  # noqa: BLE001 - a config transformers cannot build: load_model says what is wrong
        return None


def declared_refusal(spec: str, path: str) -> str | None:
    """Why ``spec``'s family refuses ``path`` ("kv", a criterion's name: ``ModelAdapter.refuses``), told from its
    config before any weight loads (:func:`declared_model`); None when it does not or only loading can tell."""
    shell = declared_model(spec)
    try:
        return None if shell is None else adapt(shell).refuses.get(path)
    except UnsupportedArchitecture:
        return None   # load_model refuses it, with the supported families


def is_lm_config(config: dict) -> bool:
    """Whether a config.json dict describes a causal language model (its architectures say so)."""
    return any(m in " ".join(config.get("architectures") or []) for m in ("ForCausalLM", "LMHeadModel"))


def named_models_help() -> str:
    return ", ".join(f"'{n}'" for n in NAMED_MODELS) or "none registered"


def _load_state_dict(folder: Path) -> dict:
    st = sorted(folder.glob("*.safetensors"))
    if st:
        state = {}
        for f in st:
            state.update(load_file(str(f)))
        return state
    binaries = sorted(folder.glob("pytorch_model*.bin"))
    if binaries:
        state = {}
        for f in binaries:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
        return state
    raise ModelLoadError(f"No weights in {folder}: expected model.safetensors (or pytorch_model.bin).")


def auto_class(config):
    """The transformers Auto class for ``config``'s head: causal LM or sequence classifier."""
    names = " ".join(getattr(config, "architectures", None) or [])
    return AutoModelForCausalLM if ("ForCausalLM" in names or "LMHeadModel" in names) \
        else AutoModelForSequenceClassification


def _load_pruned_folder(folder: Path, config, attn_implementation: str) -> nn.Module:
    """Rebuild a model saved by ``save_pruned``: parameters on the meta device (no full-size copy is ever
    allocated), cut to the recorded layout, then the saved tensors assigned in place."""
    kept = config.headprune_kept_heads
    sources = getattr(config, "headprune_kv_sources", None) or {}
    config.headprune_kept_heads, config.headprune_kv_sources = None, None  # build at full size first
    with init_empty_weights(include_buffers=False):  # buffers (rotary tables) are computed, not saved
        model = _eager_if_unsupported(lambda attn: auto_class(config).from_config(
            config, trust_remote_code=False, attn_implementation=attn), attn_implementation)
    adapter = adapt(model)
    for block in adapter.blocks:
        keep = [int(h) for h in kept.get(str(block.index), block.kept)]
        src = sources.get(str(block.index))
        if src is None:
            keep, src = plan_block(block, keep)
        if (keep, [int(g) for g in src]) != (block.kept, block.kv_sources):
            apply_layout(block, keep, [int(g) for g in src])
    record_kept_heads(adapter)
    state = _model_names(model, _load_state_dict(folder))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}   # assign=True would take any shape
    check_weight_shapes(str(folder), [(k, t.shape, shapes[k]) for k, t in state.items()
                                      if k in shapes and tuple(t.shape) != shapes[k]])
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if "position_ids" not in k]
    tied = getattr(model, "_tied_weights_keys", None) or {}
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ModelLoadError(f"Weights in {folder} do not match its recorded heads: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}.")
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(model, "tie_weights"):
        model.tie_weights()
    still_meta = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if still_meta:
        raise ModelLoadError(f"Weights in {folder} lack {still_meta[:5]}.")
    dropped = getattr(config, DROPPED_LAYERS_KEY, None)
    if dropped:   # layers a mask dropped whole (SAP's layer rule): skipped again, as when it was saved
        setattr(model.config, DROPPED_LAYERS_KEY, None)
        drop_layers(adapter, dropped)
    return model


def check_weight_shapes(spec: str, mismatched) -> None:
    """Refuse a checkpoint whose tensors have other shapes than its config.json gives the model: ``mismatched``
    holds (name, checkpoint shape, configured shape) triples. Raises ModelLoadError naming the first ones."""
    wrong = [f"{name} is {list(ckpt)} in the checkpoint, {list(want)} by the config"
             for name, ckpt, want in sorted(mismatched, key=lambda m: m[0])]
    if wrong:
        more = " ..." if len(wrong) > 3 else ""
        raise ModelLoadError(f"The weights in {spec} do not match its config.json ({len(wrong)} tensor(s): "
                             f"{'; '.join(wrong[:3])}{more}). Accepted: the config.json saved with these weights "
                             "(save_pretrained writes both).")


def _model_names(model: nn.Module, state: dict) -> dict:
    """``state`` (as save_pretrained wrote it) under the model's own parameter names. transformers renames some
    keys between a checkpoint and the modules (GPT-NeoX's ``embed_out`` is ``lm_head`` in the model, legacy
    ``LayerNorm.gamma`` is ``.weight``): from_pretrained renames them on load and save_pretrained back on save. A
    saved cut model is loaded without from_pretrained, so the same renamings are applied here."""
    renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    return {apply_renamings(key, renamings): tensor for key, tensor in state.items()} if renamings else state


def head_keys(model: nn.Module, missing) -> list[str]:
    """The ``missing`` weight names (as ``from_pretrained``'s loading info reports them) that belong to the task
    head, i.e. lie outside the base model (``classifier.*``, ``score.*``, ``lm_head.*``), tied weights aside."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return sorted(k for k in missing if not (prefix and k.startswith(prefix + ".")) and k not in tied
                  and "position_ids" not in k)


def check_head(loaded: LoadedModel, allow: bool = False) -> None:
    """Refuse to score or prune a model whose task head was initialised at random on load, unless ``allow``.

    Raises UntrainedHeadError naming the missing weights and how to go on.
    """
    if loaded.untrained_head and not allow:
        raise UntrainedHeadError(
            f"{loaded.spec}: its task head was newly initialised on load: the checkpoint has no "
            f"{', '.join(loaded.untrained_head[:4])}{' ...' if len(loaded.untrained_head) > 4 else ''} (it is a "
            f"base or {', '.join(getattr(loaded.model.config, 'architectures', None) or ['other'])} checkpoint, "
            "not a trained classifier). Scores, metrics and pruning decisions of a random head are noise. Fine-tune "
            "the model on your task first (then give the fine-tuned folder), or pass --allow-untrained-head "
            "(allow_untrained_head=True) to go on anyway.")


def _eager_if_unsupported(build, attn_implementation: str):
    """``build(attn_implementation)``, or ``build("eager")`` when the family has no such kernel (DeBERTa-v2 and
    state-space models have no sdpa): a saved cut model must load the way its uncut original did."""
    try:
        return build(attn_implementation)
    except ValueError as exc:
        if "does not support an attention implementation" not in str(exc):
            raise
        return build("eager")


def load_model(spec: str, device: str | torch.device = "auto", attn_implementation: str = "sdpa",
               device_map: str | dict | None = None, dtype: str | None = None,
               offload_folder: str | None = None) -> LoadedModel:
    """Load ``spec``: a named model (``NAMED_MODELS``: "demo", "demo-lm", "demo-circuit", built offline once), a
    local folder, or a hub id (needs the network). Errors name what is accepted. The tokenizer gets a pad token by
    the pad rule and the model's context as its length limit (``tokenizer.prepare_tokenizer``).

    ``device_map`` ("auto" or {module: device}, see ``device.parse_device_map``) places the model through
    accelerate, over several GPUs, CPU memory and disk (``offload_folder``, a temporary folder by default);
    ``device`` is then ignored. ``dtype`` "fp32" | "bf16" | "fp16" converts the weights on load.
    """
    placement = parse_device_map(device_map)
    torch_dtype = parse_dtype(dtype)
    dev = resolve_device(device) if placement is None else None
    if spec in NAMED_MODELS:
        path = NAMED_MODELS[spec].build()
        source = str(path)
    else:
        path = user_path(spec, "--model", f"a named model ({named_models_help()}), a model folder or a Hugging Face "
                         "model id", ModelLoadError)
        source = str(path)
        if not exists(path):
            if model_source_kind(spec) != "hub":
                raise ModelLoadError(f"Model path not found: {spec}. Give a named model ({named_models_help()}), "
                                     "a folder with config.json and model.safetensors, or a Hugging Face model id "
                                     "(e.g. 'bert-base-uncased').")
            path = None
            source = spec
        elif not is_dir(path) or not is_file(path / "config.json"):
            raise ModelLoadError(f"{spec} is not a model folder: it needs config.json and model.safetensors "
                                 "(a folder written by save_pretrained or by 'python -m headprune prune').")
    raw = None   # the folder's config.json as written (read once: the head-split check below reads it too)
    if path is not None and spec not in NAMED_MODELS:
        raw = folder_config(path)   # a remote-code folder refused, its config's size and nesting bounded (100,000
                                    # levels: a RecursionError) before transformers parses it
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except OSError as exc:
        if path is None:
            raise ModelLoadError(
                f"Could not fetch '{spec}' from the Hugging Face hub (offline or unknown id): {exc}. "
                f"Use a named model ({named_models_help()}) or a local folder when there is no network.") from exc
        raise ModelLoadError(f"Could not read the config in {spec}: {exc}") from exc
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise ModelLoadError(remote_code_message(spec, "its configuration needs the model's own code")) from exc
        raise ModelLoadError(f"{spec}: {exc}") from exc
    except StrictDataclassError as exc:   # the config class's own validation (e.g. heads that do not divide hidden)
        raise ModelLoadError(f"{spec}: its config.json is not a valid configuration: "
                             f"{str(exc.__cause__ or exc).strip()}") from exc
    if getattr(config, "auto_map", None):
        raise ModelLoadError(remote_code_message(spec, "its config has an 'auto_map'"))
    if not getattr(config, "headprune_kept_heads", None):   # a pruned folder is checked as it is rebuilt
        check_before_weights(spec, config, path if path is not None and spec not in NAMED_MODELS else None, raw)
    try:
        untrained: list[str] = []   # a saved pruned folder is loaded strictly: every weight is there
        if getattr(config, "headprune_kept_heads", None):
            model = _load_pruned_folder(path, config, attn_implementation)
            if torch_dtype is not None:
                model.to(torch_dtype)
            if placement is not None:
                model = _dispatch(model, placement, offload_folder)
        else:
            if path is not None:
                _load_state_dict_exists(path)
            placed = {} if placement is None else {
                "device_map": placement, "offload_folder": offload_folder or tempfile.mkdtemp(prefix="headprune-")}
            # mismatched sizes are let through so that the loading report names them (transformers' own error
            # only points to a log); any mismatch is then refused below, before the model is used
            kwargs = dict(trust_remote_code=False, use_safetensors=None, dtype=torch_dtype, output_loading_info=True,
                          ignore_mismatched_sizes=True, **placed)
            model, info = _eager_if_unsupported(
                lambda attn: auto_class(config).from_pretrained(source, attn_implementation=attn, **kwargs),
                attn_implementation)
            check_weight_shapes(spec, info.get("mismatched_keys") or ())
            untrained = head_keys(model, info.get("missing_keys") or ())
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except ModelLoadError:
        raise
    except torch.OutOfMemoryError as exc:
        raise ModelLoadError(f"'{spec}' does not fit in the memory of {device_map or dev}: {exc}. "
                             f"Options: {OFFLOAD_HELP}.") from exc
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"Could not load a model from '{spec}': {exc}") from exc
    except Exception as exc:  # unreadable weight files: a pickle refused by weights_only, a broken safetensors
        message = _unreadable_weights(spec, exc)
        if message is None:
            raise
        raise ModelLoadError(message) from exc
    adapter = adapt(model)  # raises UnsupportedArchitecture with the supported list
    if path is not None and not any((path / name).is_file() for name in TOKENIZER_FILES):
        # transformers would build an empty default tokenizer here: every word would become [UNK]
        raise ModelLoadError(f"{spec} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}). Save the "
                             "tokenizer next to the model: tokenizer.save_pretrained(folder).")
    record_kept_heads(adapter)
    prepare_tokenizer(tokenizer, model)
    if placement is None:
        model.to(dev)
    else:  # inputs go where the embeddings are; accelerate's hooks move activations between devices
        _check_map_names(model, placement)
        dev = input_device(model)
    model.eval()
    return LoadedModel(model, tokenizer, spec, source, adapter, dev, untrained)


def _check_map_names(model: nn.Module, placement: str | dict) -> None:
    """A device map naming a module the model does not have is a mistake (a typo places nothing); name it."""
    if not isinstance(placement, dict):
        return
    names = {name for name, _ in model.named_modules()}
    unknown = [key for key in placement if key and key not in names]
    if unknown:
        top = sorted({name.split(".")[0] for name in names if name})
        raise DeviceError(f"The device map names {', '.join(repr(k) for k in unknown[:3])}, which this model does "
                          f"not have. Module names start with: {', '.join(top)} (e.g. "
                          f"'{next(n for n, _ in model.named_modules() if n.count('.') == 2)}').")


def _dispatch(model: nn.Module, placement: str | dict, offload_folder: str | None) -> nn.Module:
    """Place an already-built model with accelerate (a saved pruned model is rebuilt before it is placed)."""
    device_map = infer_auto_device_map(model) if placement == "auto" else placement
    return dispatch_model(model, device_map, offload_dir=offload_folder or tempfile.mkdtemp(prefix="headprune-"))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.model")


def _unreadable_weights(spec: str, exc: Exception) -> str | None:
    """The message for a weight file that cannot be read safely, or None when ``exc`` is something else."""
    if isinstance(exc, pickle.UnpicklingError):
        return (f"The pytorch_model.bin in {spec} is a pickle holding more than tensors, and headprune loads only "
                "tensors (torch.load with weights_only=True) so that no code from a file runs. Accepted: "
                "model.safetensors, or a pytorch_model.bin holding a plain state_dict. If you trust the file, "
                "load it yourself and write model.safetensors with save_pretrained(folder).")
    if isinstance(exc, SafetensorError):
        return (f"The weights in {spec} are not a readable safetensors file ({exc}); the file may be truncated "
                "or not safetensors at all. Accepted: a model.safetensors written by save_pretrained.")
    return None


def _load_state_dict_exists(folder: Path) -> None:
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("pytorch_model*.bin")):
        raise ModelLoadError(f"No weights in {folder}: expected model.safetensors (or pytorch_model.bin).")


def write_staged(out_dir: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(folder)`` on a temporary folder next to ``out_dir`` and move it into place once complete, so a
    failure half-way (a full disk, an interrupt) never leaves a half-written model folder behind. An existing
    ``out_dir`` must be empty (its files would otherwise mix with the new model's)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelLoadError(f"{out} exists and is not an empty folder; give a new or empty folder for the model.")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        write(staging)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out


def save_pruned(model: nn.Module, tokenizer, out_dir: str | Path, extra: dict | None = None) -> Path:
    """Save a (pruned) model HF-style: safetensors + config with ``headprune_kept_heads`` + tokenizer.

    Written through ``write_staged``: nothing half-written is ever left, and an existing ``out_dir`` must be empty.
    """
    def write(folder: Path) -> None:
        record_kept_heads(adapt(model))
        model.save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        if extra:
            (folder / "headprune.json").write_text(json.dumps(extra, indent=1), encoding="utf-8")

    return write_staged(out_dir, write)
