"""``headprune run P.toml --smoke``: the whole protocol on stand-ins, in seconds, before anyone spends a GPU hour.

Every model is replaced by a tiny random model of the same family with the same label configuration, every data
role by a few synthetic rows with the same features (splits, columns, ClassLabel names), and the protocol then runs
as written through the normal runner (``run.run_protocol``): label alignment, splits, metric sets, criteria (SAP,
CF, Kwon, ...), recovery and lm-eval all run, and the output is a real, meaningless table.

Where the stand-ins come from, per model and per data source (each recorded in the run file's ``smoke`` entry):

    model    its config when it can be read without weights (a local folder, the local Hugging Face cache, or the
             hub when the network is on: ``config.json`` only), shrunk to ``testing.tiny_config``'s sizes with the
             family, the label names and the head kept; offline, the family guessed from the model id
             (``FAMILIES``) and the labels the protocol states: ``label_map``'s targets, ``labels_by_position``
             (LABEL_0..k-1 for k data classes), else the data's own label names (recorded as an assumption)
    data     the dataset's features when the network is on (``datasets.load_dataset_builder``: no rows), else the
             features of a known source (``KNOWN_SOURCES``: GLUE, the Greedy-Gnorm and HIES data sets), else
             the role's columns and the protocol's label statements; rows are seeded word strings, labels cycle
             over the classes (every class present), written with ``save_to_disk`` as a DatasetDict of the same
             splits so ClassLabel names survive and the split rule acts as on the real data set (a multiple-choice
             data set keeps the known table's layout; labels stored as text or bare ids take the stated classes)
    network  the hub the Hugging Face clients read: ``HF_ENDPOINT`` when set (a mirror), else huggingface.co;
             ``hub_reachable`` probes that host once, HF_HUB_OFFLINE=1 is offline without a probe. Each config and
             each data set's features is read once per process (``forget_hub_reads`` clears that memo)
    sizes    calibration and selection 8 rows, evaluation and training 16 ("all" included); at most 2 repeats,
             2 random orders and 2 sparsities besides 0 (the smallest and largest: the code paths of more, without
             repeating the same work) and those a [[paper]] table cites (its paper | ours | delta table in full)
    lm-eval  each lm-eval task is replaced by a local multiple-choice task "smoke_<task>" on stand-in rows
             (the metric columns are renamed accordingly; lm-eval's own data sets need the network)

The stand-ins live in ``OUT/smoke/`` (marked; rebuilt by a rerun); ``run.json`` gets ``"smoke": {...}`` and
``results.md`` a banner.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import re
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import torch
from huggingface_hub import constants as hub_constants
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedTokenizerFast

from ..data import TextDataset, align_labels
from ..data.sources import NAMED_DATA, parse_hf_spec
from ..errors import HeadpruneError
from ..evaluation.harness import is_harness_metric, parse_metric
from ..model.loading import NAMED_MODELS, is_lm_config, model_source_kind
from ..testing import ARCHS, DECODER_ARCHS, tiny_config, tiny_decoder_config, write_choice_task
from .claims import read_folder_value
from .plan import local_config, slug
from .run import RunError, check_out, run_protocol, write_atomic
from .spec import ModelEntry, Protocol, ProtocolError, Role

SMOKE_SIZES = {"calib": 8, "select": 8, "eval": 16, "train": 16}
SMOKE_REPEATS = 2              # repeats and random orders of a smoke run, at most
ROWS_PER_SPLIT = 48            # enough for every role of one source drawn apart (8 + 8 + 16 + 16)
WORDS = ("the a film story book song market price shares rose fell stock was is felt seemed good bad long short "
         "dull bright warm cold slow quick and but very quite not never love war peace cats dogs rain sun night "
         "day end start it all nothing liked question answer why how what where").split()
SPECIALS_ENCODER = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SPECIALS_DECODER = ("<pad>", "<s>", "</s>", "<unk>")

# model id words -> family (``testing`` builds these); the first match wins, so longer names come first
FAMILIES = (("xlm-roberta", "xlm-roberta"), ("roberta", "roberta"), ("albert", "albert"),
            ("distilbert", "distilbert"), ("electra", "electra"), ("llama", "llama"), ("qwen3", "qwen3"),
            ("qwen", "qwen2"), ("mistral", "mistral"), ("gemma", "gemma3"), ("phi", "phi3"), ("gpt2", "gpt2"),
            ("bert", "bert"))
NAMED_FAMILIES = {"demo": "bert", "demo-lm": "llama", "demo-circuit": "llama"}   # headprune.demos' models

# features of the data sets the shipped protocols read (the datasets' cards on the hub): columns, ClassLabel
# names (None: a float target), splits; "choice" marks multiple-choice rows in that data set's field layout
_GLUE_SPLITS = ("train", "validation", "test")
_GLUE = {"cola": (("sentence",), ["unacceptable", "acceptable"]),
         "sst2": (("sentence",), ["negative", "positive"]),
         "mrpc": (("sentence1", "sentence2"), ["not_equivalent", "equivalent"]),
         "qqp": (("question1", "question2"), ["not_duplicate", "duplicate"]),
         "stsb": (("sentence1", "sentence2"), None),
         "mnli": (("premise", "hypothesis"), ["entailment", "neutral", "contradiction"]),
         "qnli": (("question", "sentence"), ["entailment", "not_entailment"]),
         "rte": (("sentence1", "sentence2"), ["entailment", "not_entailment"]),
         "wnli": (("sentence1", "sentence2"), ["not_entailment", "entailment"])}
_LANGUAGES = "ar bg de el en es fr hi it ja nl pl pt ru sw th tr ur vi zh".split()


@dataclass
class Features:
    """What a data source's rows look like: text columns, the label column and its names, splits."""

    texts: tuple = ("text",)
    label: str | None = "label"
    names: list | None = None          # ClassLabel names; None with ``label``: a float target (regression)
    string_labels: bool = False        # labels stored as text (no ClassLabel)
    id_labels: bool = False            # labels stored as integer ids without names (no ClassLabel)
    splits: tuple = ("train", "validation", "test")
    choice: str | None = None          # "hellaswag" | "arc": multiple-choice rows in that layout
    origin: str = "known source"


def _known(name: str, config: str | None) -> Features | None:
    """``KNOWN_SOURCES``: the features of a data set the shipped protocols read, by hub name and config."""
    base = name.rsplit("/", 1)[-1].lower()
    if base == "glue" and config in _GLUE:
        texts, names = _GLUE[config]
        splits = ("train", "validation_matched", "validation_mismatched") if config == "mnli" else _GLUE_SPLITS
        return Features(texts, "label", names, splits=splits)
    if base == "financial_phrasebank":
        return Features(("sentence",), "label", ["negative", "neutral", "positive"], splits=("train",))
    if base == "tweet_eval":
        return Features(("text",), "label", ["negative", "neutral", "positive"])
    if base == "language-identification":
        return Features(("text",), "labels", list(_LANGUAGES), string_labels=True)
    if base == "hellaswag":
        return Features(("ctx",), "label", None, choice="hellaswag")
    if base == "ai2_arc":
        return Features(("question",), "answerKey", None, choice="arc")
    return None


KNOWN_SOURCES = ("nyu-mll/glue:" + "|".join(_GLUE), "takala/financial_phrasebank", "cardiffnlp/tweet_eval",
                 "papluca/language-identification", "Rowan/hellaswag", "allenai/ai2_arc")


def hub_address() -> tuple[str, int]:
    """(host, port) of the hub the clients will read: ``HF_ENDPOINT`` (a mirror, or a local hub) as huggingface_hub
    read it at import, else huggingface.co:443."""
    url = urlsplit(hub_constants.ENDPOINT)
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether configs and features may be read from the hub: not with HF_HUB_OFFLINE set (in the environment now,
    or when huggingface_hub was imported: its clients then refuse every read), and not when one connection to the
    hub's host (``hub_address``: HF_ENDPOINT's when set) fails; a single probe, as the hub clients would retry every
    read for half a minute."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on") or hub_constants.HF_HUB_OFFLINE:
        return False
    try:
        socket.create_connection(hub_address(), timeout=timeout).close()
    except OSError:
        return False
    return True


def _failure(exc: Exception) -> str:
    """One line of why a hub read failed (the clients' messages run to several lines of advice)."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first[:160]}" if first else type(exc).__name__


@functools.cache
def _hub_features(name: str, config: str | None) -> tuple[Features | None, str]:
    """(the data set's features from the hub, why not): the builder's info (the card's ``dataset_info`` and the
    repo's file listing: no rows are read). Every string column is a text column (a role may read any of them);
    the splits are the info's, else the data files' split names."""
    import datasets  # deferred: a 1.5 s import that only hf: stand-ins need

    try:
        builder = datasets.load_dataset_builder(name, config)
    except Exception as exc:   # gated, missing, a script data set, the hub out of reach: said as unchecked
        return None, _failure(exc)
    info = builder.info
    feats = info.features
    if not feats:
        return None, "its card states no features (they are read from the data files, i.e. from rows)"
    labels = [c for c, f in feats.items() if isinstance(f, datasets.ClassLabel)]
    label = labels[0] if labels else next((c for c in ("label", "labels", "score") if c in feats), None)
    texts = tuple(c for c, f in feats.items() if c != label and getattr(f, "dtype", None) == "string")
    if not texts:
        return None, f"no string column among {', '.join(feats)}"
    splits = tuple(info.splits or ()) or tuple(getattr(builder.config, "data_files", None) or ())
    # a label column without ClassLabel: text names or integer ids (their classes are in the rows only), or a
    # float target (regression)
    dtype = str(getattr(feats[label], "dtype", "")) if label and not labels else ""
    return Features(texts, label, list(feats[label].names) if labels else None, string_labels=dtype == "string",
                    id_labels=dtype.startswith(("int", "uint")), splits=splits or ("train", "validation", "test"),
                    origin="hub features"), ""


def hf_features(name: str, config: str | None, online: bool) -> tuple[Features | None, str]:
    """(features of the hub data set ``name``/``config``, why none): the hub's when ``online`` (``_hub_features``),
    else or failing that the known table's (``KNOWN_SOURCES``). Label names stored as text are not in the features
    (only the rows hold them): the known table's names complete them where it has the data set."""
    hub, why = _hub_features(name, config) if online else (None, "offline")
    known = _known(name, config)
    if hub is None:
        return known, ("" if known else why)
    if known is not None and known.choice:   # a multiple-choice layout, which features alone do not say
        return dataclasses.replace(known, splits=hub.splits, origin="hub features (splits), known source (layout)"), ""
    if (hub.string_labels or hub.id_labels) and known is not None and known.names:
        hub = dataclasses.replace(hub, names=list(known.names))
    return hub, ""


def forget_hub_reads() -> None:
    """Forget the configs and features read from the hub in this process (each is read once per process): for a
    long-lived process whose network, endpoint or hub changed."""
    _hub_features.cache_clear()
    _hub_config.cache_clear()


def _stated(role: Role, entry: ModelEntry) -> Features:
    """Features from the protocol alone: the role's columns and the label names its label map states."""
    texts = tuple(c for c in (role.text_col or "text", role.pair_col) if c)
    names = [str(k) for k in entry.label_map] if entry.label_map else ["negative", "positive"]
    return Features(texts, role.label_col or "label", names, origin="protocol statements")


def source_features(role: Role, entry: ModelEntry, online: bool) -> Features:
    """The features of ``role``'s source (module doc: hub, known table, protocol statements, in that order); a
    named data set registered unlabelled (demo-lm, demo-circuit: a language model's text) has no label column."""
    named = NAMED_DATA.get(role.source)
    if named is not None and not named.labelled and named.task is None:
        return Features(("text",), None, None, origin=f"{role.source}: unlabelled text (a language model's rows)")
    if role.source.startswith("hf:"):
        name, config, _ = parse_hf_spec(role.source)
        found, _ = hf_features(name, config, online)
        if found is not None:
            if (found.string_labels or found.id_labels) and found.names is None:   # classes in the rows only:
                found = dataclasses.replace(found, names=_stated(role, entry).names)   # the stated ones stand in
            return found
    return _stated(role, entry)


# -- rows ----------------------------------------------------------------------------------------------------------

def _phrase(rng: random.Random, low: int = 3, high: int = 10) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))


def stand_in_rows(features: Features, n: int, seed: int) -> list[dict]:
    """``n`` seeded rows with ``features``' columns; class labels cycle (every class present), floats in [0, 5]."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if features.choice == "hellaswag":
            rows.append({"ctx": _phrase(rng), "endings": [_phrase(rng, 1, 4) for _ in range(4)], "label": str(i % 4)})
            continue
        if features.choice == "arc":
            rows.append({"question": _phrase(rng), "choices": {"text": [_phrase(rng, 1, 3) for _ in range(4)],
                                                               "label": list("ABCD")}, "answerKey": "ABCD"[i % 4]})
            continue
        row = {c: _phrase(rng) for c in features.texts}
        if features.label:
            if features.names is None:
                row[features.label] = round(rng.uniform(0, 5), 2)
            else:
                k = i % len(features.names)
                row[features.label] = features.names[k] if features.string_labels else k
        rows.append(row)
    return rows


def write_source(features: Features, splits: list[str], folder: Path, seed: int) -> Path:
    """The stand-in data set: a DatasetDict of ``splits`` saved to ``folder`` (ClassLabel names kept)."""
    import datasets  # deferred: the stand-in data sets are Hugging Face DatasetDicts

    parts = {}
    for k, split in enumerate(splits):
        ds = datasets.Dataset.from_list(stand_in_rows(features, ROWS_PER_SPLIT, seed + k))
        if features.label and features.names is not None and not (features.string_labels or features.id_labels
                                                                   or features.choice):
            ds = ds.cast_column(features.label, datasets.ClassLabel(names=features.names))
        parts[split] = ds
    datasets.DatasetDict(parts).save_to_disk(str(folder))
    return folder


# -- models --------------------------------------------------------------------------------------------------------

def family_of(spec: str, config) -> str:
    """The family of a model: its config's ``model_type`` where known, else a guess from its name (FAMILIES)."""
    if config is not None:
        kind = config.model_type.replace("_", "-")
        return {"qwen2": "qwen2", "xlm-roberta": "xlm-roberta"}.get(kind, kind)
    if spec in NAMED_FAMILIES:
        return NAMED_FAMILIES[spec]
    low = spec.lower()
    return next((fam for word, fam in FAMILIES if word in low), "bert")


@functools.cache
def _hub_config(spec: str):
    """(the hub's config.json of ``spec``, why not): the config alone, never weights; read once per process."""
    try:
        return AutoConfig.from_pretrained(spec), ""
    except Exception as exc:   # gated, missing, an unknown model type: the family and the stated labels stand in
        return None, _failure(exc)


def model_config(spec: str, online: bool):
    """(the model's config without weights, why none): this machine's copy (a folder, the local Hugging Face
    cache), else the hub's config.json when ``online``; a named model (a demo) has none here (its config needs
    its build, minutes: the family table stands in)."""
    if model_source_kind(spec) == "named" or spec in NAMED_MODELS:
        return None, "a named model: its config comes with its build"
    config = local_config(spec)
    if config is not None:
        return config, ""
    if not online:
        return None, "its config.json is not on this machine; offline"
    config, why = _hub_config(spec)
    return config, ("" if config is not None else f"the hub did not give its config.json: {why}")


def stated_labels(entry: ModelEntry, features: Features) -> tuple[dict[int, str], str]:
    """(id2label, how) of a stand-in classifier from the protocol's statements (module doc)."""
    if features.label and features.names is None:
        return {0: "LABEL_0"}, "regression (the data's label is a number)"
    n_data = len(features.names or ["negative", "positive"])
    if entry.label_map:
        targets = list(entry.label_map.values())
        ids = [int(m.group(1)) for t in targets if isinstance(t, str) and (m := re.fullmatch(r"LABEL_(\d+)", t))]
        ints = [t for t in targets if isinstance(t, int)]
        if len(ids) + len(ints) == len(targets):
            n = max([n_data - 1] + ids + ints) + 1
            return {i: f"LABEL_{i}" for i in range(n)}, "label_map (positional targets)"
        names = list(dict.fromkeys(str(t) for t in targets))
        return dict(enumerate(names)), "label_map (named targets)"
    if entry.labels_by_position:
        return {i: f"LABEL_{i}" for i in range(n_data)}, "labels_by_position (LABEL_0..k-1)"
    return dict(enumerate(features.names or ["negative", "positive"])), \
        "not stated: assumed the model names the data's labels (state label_map or labels_by_position)"


def word_tokenizer(decoder: bool) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over WORDS: ``[CLS] a [SEP] b [SEP]`` for encoders, ``<s> text`` for decoders."""
    specials = SPECIALS_DECODER if decoder else SPECIALS_ENCODER
    vocab = {w: i for i, w in enumerate(list(specials) + list(dict.fromkeys(WORDS)))}
    unk = "<unk>" if decoder else "[UNK]"
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if decoder:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                           special_tokens=[("<s>", vocab["<s>"])])
        return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                       unk_token=unk)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token=unk, cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


@dataclass
class ModelStandIn:
    path: Path
    family: str
    head: str                      # "cls" | "lm"
    id2label: dict = field(default_factory=dict)
    origin: str = ""
    labels: str = ""

    def to_json(self) -> dict:
        return {"path": str(self.path), "family": self.family, "head": self.head,
                "id2label": {str(k): v for k, v in self.id2label.items()}, "config": self.origin,
                "labels": self.labels}


def stand_in_model(entry: ModelEntry, features: Features, folder: Path, online: bool, seed: int) -> ModelStandIn:
    """A tiny random model of ``entry``'s family and label configuration, saved to ``folder`` (module doc)."""
    config, _ = model_config(entry.model, online)
    family = family_of(entry.model, config)
    decoder = family in DECODER_ARCHS
    head = "lm" if features.choice or features.label is None else "cls"
    if config is not None and head == "cls" and getattr(config, "id2label", None):
        id2label, labels = {int(k): v for k, v in config.id2label.items()}, "the model's config"
        if config.num_labels == 1:
            id2label = {0: "LABEL_0"}
    else:
        id2label, labels = stated_labels(entry, features) if head == "cls" else ({}, "none (a language model)")
    tokenizer = word_tokenizer(decoder)
    vocab = len(tokenizer) + 8
    n = max(len(id2label), 1)
    if decoder:
        tiny = tiny_decoder_config(family, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=vocab, num_labels=n)
        tiny.pad_token_id, tiny.bos_token_id, tiny.eos_token_id = 0, 1, 2
    else:
        tiny = tiny_config(family if family in ARCHS else "bert", n_layers=2, n_heads=4, vocab_size=vocab,
                           num_labels=n)
        tiny.pad_token_id = 0
    if head == "cls":
        tiny.id2label, tiny.label2id = dict(id2label), {v: k for k, v in id2label.items()}
    torch.manual_seed(seed)
    auto = AutoModelForCausalLM if head == "lm" else AutoModelForSequenceClassification
    model = auto.from_config(tiny).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    origin = "its config (shrunk)" if config is not None else f"the family of its name ({family}), offline"
    return ModelStandIn(folder, family if (family in ARCHS or decoder) else f"bert (for {family})", head, id2label,
                        origin, labels)


# -- labels, splits and columns checked before any weights -------------------------------------------------------

@dataclass
class LabelCheck:
    """What ``check_labels`` found: problems (each naming the model, the role, the key and its line), the checks
    it made and the ones it could not make (offline: a hub config or a data set's features out of reach)."""

    problems: list = field(default_factory=list)
    checked: list = field(default_factory=list)
    unchecked: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"problems": self.problems, "checked": self.checked, "unchecked": self.unchecked}


def _feature_rows(features: Features, source: str) -> TextDataset:
    """One row per class of ``features`` as ``load_data`` would hold them (ClassLabel ints with their names)."""
    if features.names is None:
        return TextDataset(texts=["x"], labels=[2.5], source=source)
    if features.string_labels:
        return TextDataset(texts=["x"] * len(features.names), labels=list(features.names), source=source)
    if features.id_labels:
        return TextDataset(texts=["x"] * len(features.names), labels=list(range(len(features.names))), source=source)
    return TextDataset(texts=["x"] * len(features.names), labels=list(range(len(features.names))),
                       label_names=list(features.names), source=source)


def _protocol_hint(entry: ModelEntry, features: Features) -> str:
    """How a protocol states the mapping the label guard asks for (the guard's own text names the CLI's flags)."""
    first = (features.names or ["negative"])[0]
    return (f" In the protocol, under [[models]] name = \"{entry.name}\": labels_by_position = true (when the "
            f"model card confirms that order), or label_map = {{ {first} = \"LABEL_0\", ... }}.")


def check_labels(protocol: Protocol, online: bool) -> LabelCheck:
    """Every model's label alignment, and every role's split and columns, against the model's config and the data
    set's features (no weights, no rows): ``align_labels`` on one row per class, with the entry's ``label_map`` /
    ``labels_by_position``, exactly as the run will call it. Configs are this machine's or, ``online``, the hub's
    config.json (``model_config``); features the hub's (online) or the known table's (``hf_features``); what
    neither reaches is listed as unchecked, with the reason."""
    found = LabelCheck()
    for entry in protocol.models:
        config, why = model_config(entry.model, online)
        language_model = config is not None and is_lm_config(config.to_dict())
        if config is None:
            found.unchecked.append(f"{entry.name}: labels of {entry.model} ({why})")
        check_expected_config(entry, config, why, found)
        for name, role in entry.data.items():
            where = f"{entry.name}, data.{name} ({role.source})"
            if not role.source.startswith("hf:"):
                found.unchecked.append(f"{where}: read when the run starts (not a hub data set)")
                continue
            hub, config_name, split = parse_hf_spec(role.source)
            features, why = hf_features(hub, config_name, online)
            if features is None:
                found.unchecked.append(f"{where}: its splits, columns and labels ({why})")
                continue
            before = len(found.problems)
            if split and split not in features.splits:
                found.problems.append(str(role.fail("source", f"{entry.name}: split {split!r} is not one of "
                                                              f"{', '.join(features.splits)} ({features.origin}).")))
            columns = list(features.texts) + ([features.label] if features.label else [])
            for key in ("text_col", "pair_col", "label_col"):
                if getattr(role, key) and getattr(role, key) not in columns:
                    found.problems.append(str(role.fail(key, f"{entry.name}: no column {getattr(role, key)!r}; "
                                                             f"the data set has {', '.join(columns)} "
                                                             f"({features.origin}).")))
            made = "split and columns"
            if (features.string_labels or features.id_labels) and features.names is None and config is not None \
                    and not language_model:
                found.unchecked.append(f"{where}: labels (stored as " + ("text" if features.string_labels else
                                                                         "integer ids") + ": the classes are in the "
                                       "rows only)")
            elif config is not None and features.label and not features.choice and not language_model:
                id2label = {int(k): v for k, v in config.id2label.items()}
                source = f"{hub}" + (f":{config_name}" if config_name else "") + f" ({features.origin})"
                try:
                    align_labels(_feature_rows(features, source), id2label, label_map=entry.label_map,
                                 by_position=entry.labels_by_position)
                    made = "labels, split and columns"
                except HeadpruneError as exc:
                    key = "label_map" if entry.label_map else \
                        "labels_by_position" if entry.labels_by_position else "model"
                    hint = "" if entry.label_map or entry.labels_by_position else _protocol_hint(entry, features)
                    found.problems.append(str(entry.fail(key, f"{entry.name}, data.{name}: {exc}{hint}")))
            if len(found.problems) == before:
                found.checked.append(f"{where}: {made} ({features.origin})")
    return found


def check_expected_config(entry: ModelEntry, config, why: str, found: LabelCheck) -> None:
    """``entry.expect_config`` (the shape a paper's size table implies) against the model's config: each key a
    problem when it differs, all of them checked (with the config's vocabulary and classes named) when they agree,
    unchecked with the reason when the config is out of reach (offline, a hub id not in the local cache)."""
    if not entry.expect_config:
        return
    wanted = ", ".join(f"{k} = {v}" for k, v in entry.expect_config.items())
    if config is None:
        found.unchecked.append(f"{entry.name}: {entry.model}'s config against the paper's shape ({wanted}): {why}")
        return
    served = config.to_dict()
    served.setdefault("num_labels", config.num_labels)
    wrong = [f"{k} is {served.get(k, 'absent')!r}, the paper's shape needs {v!r}"
             for k, v in entry.expect_config.items() if served.get(k) != v]
    if wrong:
        found.problems.append(str(entry.fail("expect_config", f"{entry.name}: {entry.model}: " + "; ".join(wrong)
                                             + ".")))
        return
    found.checked.append(f"{entry.name}: {entry.model} has the paper's shape ({wanted}; vocabulary "
                         f"{served.get('vocab_size')}, {config.num_labels} classes: "
                         f"{', '.join(str(v) for v in config.id2label.values())})")


def require_labels(protocol: Protocol, online: bool, found: LabelCheck | None = None) -> LabelCheck:
    """``check_labels`` (or what it ``found`` already), raising a ProtocolError listing every problem."""
    found = check_labels(protocol, online) if found is None else found
    if found.problems:
        raise ProtocolError(f"{len(found.problems)} label/split/column problem(s) found before loading any weights:\n"
                            + "\n".join(f"  {p}" for p in found.problems))
    return found


# -- the smoke protocol --------------------------------------------------------------------------------------------

@dataclass
class SmokeBuild:
    """The stand-in protocol and what every stand-in was built from (the run file's ``smoke`` entry)."""

    protocol: Protocol
    models: dict = field(default_factory=dict)      # entry name -> ModelStandIn.to_json()
    sources: dict = field(default_factory=dict)     # real source -> {"stand_in", "features", ...}
    notes: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"models": self.models, "sources": self.sources, "notes": self.notes, "sizes": dict(SMOKE_SIZES)}


def _source_key(source: str) -> tuple[str, str | None]:
    """(data set, split) of a role's source: hf specs by name and config, other specs as they are."""
    if source.startswith("hf:"):
        name, config, split = parse_hf_spec(source)
        return f"{name}:{config}" if config else name, split
    return source, None


def _lm_eval_name(task: str) -> str:
    return f"smoke_{slug(task).replace('-', '_')}"


def _lm_eval_task(task: str, folder: Path, seed: int) -> str:
    """A local multiple-choice lm-eval task ``smoke_<task>`` on stand-in questions (the real task's data needs the
    network); returns its name."""
    name = _lm_eval_name(task)
    rng = random.Random(seed)
    write_choice_task(folder, name, [(_phrase(rng), [_phrase(rng, 1, 3) for _ in range(4)], i % 4) for i in range(8)])
    return name


def _smoke_metric(metric: str, renamed: dict) -> str:
    if not is_harness_metric(metric):
        return metric
    task, name = parse_metric(metric)
    return f"lm-eval:{renamed[task]}/{name}"


def build_smoke(protocol: Protocol, folder: Path, online: bool = False, recorded: dict | None = None) -> SmokeBuild:
    """The stand-in protocol of ``protocol`` (module doc), its stand-ins written under ``folder``.

    ``recorded``: the stand-ins' mark of a smoke run (``SmokeBuild.to_json``): the stand-in protocol is rebuilt
    from the paths it records, and nothing is read or written (``smoke_protocol``: what a status reads)."""
    if recorded is None:
        folder.mkdir(parents=True, exist_ok=True)
    build = SmokeBuild(protocol)
    written: dict[str, tuple[Path, Features, list]] = {}
    # every split each data set is read with, so one stand-in holds them all
    wanted: dict[str, tuple[Role, ModelEntry, set]] = {}
    for entry in protocol.models:
        for role in entry.data.values():
            key, split = _source_key(role.source)
            wanted.setdefault(key, (role, entry, set()))[2].add(split)
    for i, (key, (role, entry, splits)) in enumerate(wanted.items()):
        if recorded is not None:
            build.sources[key] = recorded["sources"][key]
            written[key] = (Path(recorded["sources"][key]["stand_in"]), None, [])
            continue
        features = source_features(role, entry, online)
        names = list(dict.fromkeys([s for s in features.splits] + [s for s in splits if s]))
        path = write_source(features, names, folder / "data" / slug(key.replace(":", "-")), protocol.seed + 100 * i)
        written[key] = (path, features, names)
        build.sources[key] = {"stand_in": str(path), "features": features.origin, "splits": names,
                              "columns": list(features.texts) + ([features.label] if features.label else []),
                              "labels": features.names, "choice": features.choice}
    renamed: dict[str, str] = {}
    entries = []
    for k, entry in enumerate(protocol.models):
        eval_key, _ = _source_key(entry.data["eval"].source)
        if recorded is not None:
            build.models[entry.name] = recorded["models"][entry.name]
            model_path = recorded["models"][entry.name]["path"]
        else:
            features = written[eval_key][1]
            model = stand_in_model(entry, features, folder / "models" / slug(entry.name), online, protocol.seed + k)
            build.models[entry.name] = model.to_json()
            model_path = model.path
        labels = build.models[entry.name].get("labels", "")
        if labels.startswith("not stated"):
            build.notes.append(f"{entry.name}: labels {labels}")
        roles = {}
        for name, role in entry.data.items():
            key, split = _source_key(role.source)
            spec = f"hf:{written[key][0]}" + (f"::{split}" if split else "")   # a saved folder: no config
            roles[name] = dataclasses.replace(role, source=spec, size=min(role.size or SMOKE_SIZES[name],
                                                                          SMOKE_SIZES[name]))
        for metric in entry.harness_metrics:
            task, _ = parse_metric(metric)
            if task not in renamed:
                renamed[task] = _lm_eval_name(task) if recorded is not None else \
                    _lm_eval_task(task, folder / "lm_eval", protocol.seed + len(renamed))
                build.notes.append(f"lm-eval task {task} stood in for by the local task {renamed[task]}")
        metrics = tuple(_smoke_metric(m, renamed) for m in entry.metrics)
        headline = _smoke_metric(entry.headline, renamed) if entry.headline else None
        entries.append(dataclasses.replace(entry, model=str(model_path), data=roles, metrics=metrics,
                                           headline=headline))
    # repeats, random orders and sparsities exercise their code paths at two; more of them repeat the same work
    repeats = min(protocol.repeats, SMOKE_REPEATS)
    positive = [r for r in protocol.sparsities if r > 0]
    # a ratio a [[paper]] table cites is kept too: the smoke run prints the paper | ours | delta table in full
    cited = {r for entry in protocol.paper for c, cells in entry.values.items() if c != "dense" for r in cells}
    sparsities = protocol.sparsities if len(positive) <= 2 else tuple(
        r for r in protocol.sparsities if r == 0 or r in (positive[0], positive[-1])
        or any(abs(r - c) < 1e-9 for c in cited))
    if sparsities != protocol.sparsities:
        build.notes.append(f"sparsities {', '.join(f'{r:g}' for r in protocol.sparsities)} -> "
                           f"{', '.join(f'{r:g}' for r in sparsities)} (the smallest, the largest and those a "
                           "[[paper]] table cites)")
    trajectory = protocol.trajectory
    if trajectory is not None and trajectory.random_boxes > SMOKE_REPEATS:
        trajectory = dataclasses.replace(trajectory, random_boxes=SMOKE_REPEATS)
    if repeats < protocol.repeats or trajectory is not protocol.trajectory:
        build.notes.append(f"repeats {protocol.repeats} -> {repeats}" + (
            f", random_boxes {protocol.trajectory.random_boxes} -> {SMOKE_REPEATS}"
            if trajectory is not protocol.trajectory else "") + " (the same code paths, less of the same work)")
    lm_eval = dict(protocol.lm_eval)
    if renamed:
        lm_eval["include"] = tuple(lm_eval.get("include", ())) + (str(folder / "lm_eval"),)
        lm_eval["limit"] = 8
    try:
        build.protocol = dataclasses.replace(protocol, models=tuple(entries), lm_eval=lm_eval, repeats=repeats,
                                             trajectory=trajectory, sparsities=sparsities,
                                             paper=_cells_kept(protocol.paper, sparsities),
                                             device="cpu", dtype=None, memory_budget=None)
    except HeadpruneError as exc:   # a stand-in the protocol's own checks refuse: a bug of this module
        raise HeadpruneError(f"the smoke stand-ins of {protocol.source} are refused by the protocol's checks: "
                             f"{exc}") from None
    return build


def _cells_kept(paper: tuple, sparsities: tuple) -> tuple:
    """``paper`` values of the sparsities a smoke run keeps (the others name cells it does not run)."""
    kept = []
    for entry in paper:
        values = {c: {r: v for r, v in cells.items() if c == "dense" or any(abs(r - s) < 1e-9 for s in sparsities)}
                  for c, cells in entry.values.items()}
        kept.append(dataclasses.replace(entry, values={c: {f"{r:g}": v for r, v in cells.items()} if c != "dense"
                                                       else next(iter(cells.values()), None)
                                                       for c, cells in values.items() if cells}))
    return tuple(kept)


BANNER = ("> **SMOKE RUN** — every model is a tiny random stand-in and every data role a few synthetic rows "
          "(`headprune run --smoke`). These numbers are meaningless; they show only that the protocol runs end to "
          "end.\n\n")


STAND_INS = "smoke"                      # OUT/smoke: the stand-ins, marked by MARK
MARK = "headprune-smoke-stand-ins.json"


def smoke_protocol(protocol: Protocol, out: str | Path) -> Protocol | None:
    """The stand-in protocol a smoke run of ``protocol`` ran into ``out`` (its cells, their fingerprints), rebuilt
    from the stand-ins' mark without writing anything; None when ``out`` holds no smoke run's stand-ins. A status
    read against ``protocol`` itself would find none of the smoke cells (issue 35: "0/13 done")."""
    mark = Path(out).expanduser() / STAND_INS / MARK
    if not mark.is_file():
        return None
    recorded = read_folder_value(mark, "smoke run's mark")   # a results folder's file: the one safe reader
    try:
        return build_smoke(protocol, mark.parent, recorded=recorded).protocol
    except (ValueError, KeyError, TypeError, HeadpruneError):   # a mark of another version: read as a plain run
        return None


def run_smoke(protocol: Protocol, out: str | Path, *, online: bool = False, progress=None, say=None,
              plots: bool = False, force: bool = False) -> dict:
    """Build the stand-ins of ``protocol`` under ``OUT/smoke`` and run it into ``out`` (module doc); the run file is
    marked ``"smoke"`` and ``results.md`` carries a banner.

    ``out`` is checked as a run's folder first (``run.check_out``: new, empty, an earlier run of this protocol, or
    ``force``); the stand-ins are then the only files there the run did not write, so the run itself goes on past
    them. A rerun rebuilds them (the folder is removed only when it carries the stand-ins' mark)."""
    check_out(out, protocol, force)
    out = Path(out).expanduser()
    folder = out / STAND_INS
    if folder.exists():
        if not (folder / MARK).is_file():
            raise RunError(f"{folder} exists and does not hold a smoke run's stand-ins (no {MARK}); it is left as it "
                           "is. Accepted: another --out, or move that folder.")
        shutil.rmtree(folder)
    build = build_smoke(protocol, folder, online)
    write_atomic(folder / MARK, json.dumps(build.to_json(), indent=1, default=str))
    summary = run_protocol(build.protocol, out, progress=progress, say=say, plots=plots, force=True)
    run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    run["smoke"] = build.to_json()
    write_atomic(out / "run.json", json.dumps(run, indent=1, default=str))
    write_atomic(out / "results.md", BANNER + (out / "results.md").read_text(encoding="utf-8"))
    return {**summary, "smoke": True, "smoke_notes": build.notes}
