"""lm-evaluation-harness as the standard: ``lm_eval.simple_evaluate`` on headprune's in-memory model, under a mask.

LLM-Pruner, FLAP, SliceGPT, Wanda and HIES (App. C.4, Figs. 4-5: HellaSwag, ARC-e, ARC-c) report a pruned
decoder's zero-shot accuracy through lm-evaluation-harness. This module runs it on the model headprune holds
(``HFLM`` wrapping the model instance and its tokenizer, so the placement ``--device-map`` / ``--dtype`` gave it is
what lm-eval uses), with the pruned heads applied one of two ways (``HarnessSpec.apply``):

    gate  headprune's gating (``model.gating.gate_heads``) on a private ``structural_copy``: exact (a gate of 0
          is what removing the head does, tests/test_equivalence.py), costs no memory beyond module objects, and
          works for any mask and any placement. The default.
    cut   ``model.surgery.prune_model``: a smaller deep copy, faster per forward once the mask removes a lot of a
          big model, at the price of holding a second copy of the weights while it runs.

The context/continuation split is the one rule of headprune's own multiple-choice scoring
(``data.choice.split_context_continuation``): ``_encode_pair`` of the harness model is overridden to call it.
lm-eval's own split encodes with the tokenizer's special tokens, so a tokenizer that appends an end token to every
encode -- the LM demo's ``<bos> $A <eos>`` -- has lm-eval drop the choice's first token and score the end token
instead. For a tokenizer that adds only a start token (Llama's) the rule and stock lm-eval give the same ids
(tests/test_harness.py runs stock lm-eval on the masked export to show it).

Tasks are checked against lm-eval's ``TaskManager`` before any model loads (``resolve_tasks``): first the shipped
offline tasks (``SHIPPED_TASKS``: ``demo_lm_cloze``) and the ``include`` folders alone (instant), then lm-eval's
own index (about 15 s: it scans some 200 folders of YAML). A task whose data set needs the network and cannot
fetch it is refused with the way to run it from local files.

``lm_eval`` is an optional extra (``pip install "headprune[eval]"``): every import of it is local to the function
that needs it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch

from ..data.choice import split_context_continuation
from ..errors import HeadpruneError
from ..limits import ROWS_PER_BATCH, Interval
from ..model.arch import adapt
from ..model.gating import gate_heads
from ..model.hooks import structural_copy
from ..model.layers import drop_layers
from ..model.mask import HeadMask
from ..model.surgery import prune_model
from ..provenance import versions
from ..userinput import read_user_text

SHIPPED_TASKS = Path(__file__).resolve().parents[1] / "resources" / "lm_eval_tasks"
APPLY = ("gate", "cut")
METRIC_PREFIX = "lm-eval:"
OFFLINE_HELP = ("To run offline, write the task as a YAML with 'dataset_path: json' and 'dataset_kwargs: "
                "{data_files: {test: /absolute/path/to/rows.jsonl}}' (or 'custom_dataset: !function helper.load' "
                "with a helper beside the YAML that reads its own folder, as headprune/resources/lm_eval_tasks/"
                "demo_lm_cloze does) and pass its folder with --lm-eval-include DIR")
INSTALL_HELP = 'lm-evaluation-harness is not installed: pip install "headprune[eval]" (lm-eval 0.4.13)'

Progress = Callable[[float, str], None]


class HarnessError(HeadpruneError):
    """An lm-eval task that does not exist or cannot load, a bad harness setting, lm-eval missing."""


# how lm-eval runs: limits declared once, each with the reason it stops there (CLI options and [lm_eval] alike)
LIMIT = Interval(1, 10_000_000, integer=True, why="examples per task; no task has more documents")
FEWSHOT = Interval(0, 1000, integer=True, why="examples written into every prompt")
BOOTSTRAP = Interval(0, 1_000_000, integer=True, why="lm-eval's resamples for a standard error (its own default "
                                                      "is 100,000)")


@dataclass(frozen=True, kw_only=True)
class HarnessSpec:
    """What to run through lm-evaluation-harness, validated once (before any model loads).

    tasks        lm-eval task, group or tag names ("hellaswag", "arc_easy", "demo_lm_cloze")
    limit        examples per task (None: all); lm-eval's ``limit``
    include      folders of task YAMLs added to lm-eval's index (the shipped ``SHIPPED_TASKS`` always are)
    num_fewshot  examples in the prompt (None: the task's own default, 0 for most)
    batch_size   rows per forward in lm-eval's loop
    apply        "gate" | "cut": how the mask's heads are removed (module doc)
    seed         lm-eval's random, numpy, torch and few-shot seeds
    bootstrap_iters  lm-eval's bootstrap for the standard errors of non-mean metrics (acc's is closed-form)
    loglikelihoods   also report every request's log-likelihood (lm-eval's logged samples, without the documents)
    """

    tasks: tuple[str, ...]
    limit: int | None = None
    include: tuple[str, ...] = ()
    num_fewshot: int | None = None
    batch_size: int = 32
    apply: str = "gate"
    seed: int = 0
    bootstrap_iters: int = 1000
    loglikelihoods: bool = False

    def __post_init__(self):
        tasks = tuple(t.strip() for t in self.tasks if t.strip())
        if not tasks:
            raise HarnessError("--lm-eval needs at least one task name, e.g. --lm-eval hellaswag,arc_easy or "
                               "--lm-eval demo_lm_cloze (the offline demo task).")
        object.__setattr__(self, "tasks", tasks)
        for value, option, limit in ((self.limit, "--lm-eval-limit", LIMIT),
                                     (self.num_fewshot, "--num-fewshot", FEWSHOT),
                                     (self.batch_size, "--batch-size", ROWS_PER_BATCH),
                                     (self.bootstrap_iters, "bootstrap_iters", BOOTSTRAP)):
            if value is not None and limit(value):
                raise HarnessError(f"{option} {value}: {limit(value)}.")
        if self.apply not in APPLY:
            raise HarnessError(f"apply {self.apply!r}: accepted {', '.join(APPLY)} (gate: headprune's gating on a "
                               "copy, exact; cut: a smaller copy by surgery).")
        for folder in self.include:
            if not Path(folder).expanduser().is_dir():
                raise HarnessError(f"--lm-eval-include {folder}: not a folder. Accepted: a folder holding lm-eval "
                                   "task YAML files (searched recursively).")

    @classmethod
    def from_text(cls, tasks: str, **kw) -> HarnessSpec:
        """From ``--lm-eval`` "hellaswag,arc_easy" and the other options."""
        return cls(tasks=tuple(tasks.split(",")), **kw)

    def include_paths(self) -> list[str]:
        """The folders lm-eval indexes beside its own: the shipped offline tasks, then ``include``."""
        return [str(SHIPPED_TASKS)] + [str(Path(p).expanduser().resolve()) for p in self.include]


@dataclass
class Tasks:
    """Tasks checked against lm-eval's index: the ``TaskManager`` that knows them all (passed on to
    ``simple_evaluate``, so the index is built once)."""

    spec: HarnessSpec
    manager: object = field(repr=False)


def lm_eval_version() -> str:
    try:
        import lm_eval  # optional extra, imported only when lm-eval is used
    except ImportError as exc:
        raise HarnessError(INSTALL_HELP) from exc
    return versions("lm_eval")["lm_eval"] or getattr(lm_eval, "__version__", "unknown")


FUNCTION_TAG = re.compile(r"!function\s+([A-Za-z_][\w.]*)\.[A-Za-z_]\w*")   # "!function utils.process_docs"
TASK_KEY = re.compile(r"^(task|group):\s*['\"]?([^'\"\s#]+)", re.MULTILINE)
INCLUDE_KEY = re.compile(r"^include:\s*['\"]?([^'\"\s#]+)", re.MULTILINE)


def _yaml_text(path: Path) -> str:
    try:   # the one safe reader: a FIFO or a device among the YAML files is never opened
        return read_user_text(path, "Task YAML", "a YAML file of lm-eval tasks", error=HarnessError)
    except HarnessError:
        return ""   # lm-eval names an unreadable YAML itself when it indexes the folder


def user_code(spec: HarnessSpec) -> dict[str, list[Path]]:
    """The Python files lm-evaluation-harness will import for ``spec``'s tasks from the user's ``include``
    folders: ``!function module.name`` helpers named in the YAML of a requested task or group (searched
    recursively, as lm-eval does), and in the YAML files those ``include:``. {task or group name: [.py files]}.

    lm-eval imports a helper by design, as the task's code; headprune only reads the YAML text (nothing runs here),
    so the CLI can say which files will run before it resolves the tasks. The shipped tasks hold no helper.
    """
    wanted, found = set(spec.tasks), {}
    for folder in spec.include:
        for yaml in sorted(Path(folder).expanduser().rglob("*.y*ml")):
            text = _yaml_text(yaml)
            names = {name for _, name in TASK_KEY.findall(text)} & wanted
            if not names:
                continue
            files, chain, seen = [], [yaml], set()
            while chain:   # the YAML and the files it includes (relative to it), each read once
                current = chain.pop()
                if current in seen:
                    continue
                seen.add(current)
                body = _yaml_text(current)
                files += [current.parent / f"{module.replace('.', '/')}.py" for module in FUNCTION_TAG.findall(body)]
                chain += [current.parent / inc for inc in INCLUDE_KEY.findall(body)]
            for name in names:
                found.setdefault(name, [])
                found[name] += [f for f in dict.fromkeys(files) if f not in found[name]]
    return {name: files for name, files in found.items() if files}


def resolve_tasks(spec: HarnessSpec, check_data: bool = True) -> Tasks:
    """Check every task name of ``spec`` against lm-eval's index (and, with ``check_data``, that its data loads),
    before any model loads. Raises HarnessError naming the unknown task, near names, and how to run offline."""
    lm_eval_version()
    from lm_eval.tasks import TaskManager  # optional extra, imported only when lm-eval is used

    manager = TaskManager(include_path=spec.include_paths(), include_defaults=False)
    if not all(manager.match_tasks([name]) for name in spec.tasks):
        manager = TaskManager(include_path=spec.include_paths())   # lm-eval's own index too: ~15 s to scan
    unknown = [name for name in spec.tasks if not manager.match_tasks([name])]
    if unknown:
        near = sorted({m for name in unknown for m in difflib.get_close_matches(name, manager.all_tasks, n=4)})
        raise HarnessError(f"lm-eval has no task {', '.join(map(repr, unknown))}"
                           + (f" (near names: {', '.join(near)})" if near else "")
                           + f". List the known ones with `lm-eval ls tasks`; folders searched besides lm-eval's "
                             f"own: {', '.join(spec.include_paths())}. {OFFLINE_HELP}.")
    if check_data:
        for name in spec.tasks:
            try:
                manager.load([name])
            except Exception as exc:  # noqa: BLE001 - datasets raises many kinds (ConnectionError, HfHubHTTPError,
                raise HarnessError(   # DatasetNotFoundError, FileNotFoundError): each means "cannot load the data"
                    f"lm-eval task '{name}' could not load its data ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:300] if str(exc) else ''}). A task from the Hugging Face hub needs "
                    f"the network the first time (then the datasets cache); {OFFLINE_HELP}.") from exc
    return Tasks(spec, manager)


# -- the model lm-eval sees -----------------------------------------------------------------------------------------

@cache
def _harness_model_class():
    """``HFLM`` with headprune's split rule and a progress callback (built on first use: lm-eval is optional)."""
    from lm_eval.models.huggingface import HFLM  # optional extra, imported only when lm-eval is used

    class HeadpruneLM(HFLM):
        """HFLM on a model instance; ``progress(fraction, message)`` is called after every forward (an exception
        it raises -- ``errors.Cancelled``, a dashboard rerun -- stops the run between two batches)."""

        def __init__(self, *args, progress: Progress | None = None, **kwargs):
            super().__init__(*args, **kwargs)
            self.progress, self.rows_done, self.rows_total = progress, 0, 1

        def _encode_pair(self, context: str, continuation: str):
            # lm-eval's continuation already starts with the task's target_delimiter: no separator added here
            return split_context_continuation(self.tokenizer, context, continuation, separator="")

        def _loglikelihood_tokens(self, requests, *args, **kwargs):
            self.rows_done, self.rows_total = 0, max(len(requests), 1)
            return super()._loglikelihood_tokens(requests, *args, **kwargs)

        def _model_call(self, inps, *args, **kwargs):
            out = super()._model_call(inps, *args, **kwargs)
            self.rows_done += int(inps.shape[0])
            if self.progress is not None:   # rows sharing a context may be run once: the count is an upper bound
                self.progress(min(self.rows_done / self.rows_total, 0.99),
                              f"{min(self.rows_done, self.rows_total)}/{self.rows_total} requests")
            return out

    return HeadpruneLM


def harness_model(model, tokenizer, batch_size: int = 32, progress: Progress | None = None):
    """The lm-eval model for ``model`` as it is placed (HFLM reads the device from the instance; a model spread by
    a device map gets its inputs where its first parameters are and accelerate's hooks move the rest). The
    tokenizer is copied: HFLM may set a pad token on it."""
    return _harness_model_class()(pretrained=model, tokenizer=copy.deepcopy(tokenizer), batch_size=batch_size,
                                  progress=progress)


def _applied(model, mask: HeadMask | None, apply: str, dropped_layers=()):
    """The model lm-eval runs: a structural copy (gated by the caller) or the cut copy, with ``dropped_layers``
    skipped for good on that copy (SAP's layer rule; the caller's model keeps its layers)."""
    if mask is None or not mask.n_pruned:
        work, gates = structural_copy(model), None
    elif apply == "cut":
        work, gates = prune_model(model, mask), None
    else:
        work, gates = structural_copy(model), mask
    drop_layers(adapt(work), dropped_layers)
    return work, gates


# -- running ---------------------------------------------------------------------------------------------------------

def run_lm_eval(model, tokenizer, tasks: Tasks | HarnessSpec, mask: HeadMask | None = None,
                progress: Progress | None = None, dropped_layers=()) -> dict:
    """Run lm-eval's ``simple_evaluate`` on ``model`` under ``mask`` and with ``dropped_layers`` skipped (the
    caller's model is never hooked or changed). Returns lm-eval's output verbatim where JSON can hold it:
    ``results``, ``versions`` (task versions), ``n-shot``, ``n-samples``, ``higher_is_better``, ``group_subtasks``,
    ``configs`` and ``config`` (values JSON cannot write, e.g. a ``custom_dataset`` function, as text), plus
    ``lm_eval_version``, ``transformers_version``, ``apply``, ``dropped_layers`` and ``seconds``.
    """
    if isinstance(tasks, HarnessSpec):
        tasks = resolve_tasks(tasks, check_data=False)
    spec = tasks.spec
    from lm_eval import simple_evaluate  # optional extra, imported only when lm-eval is used

    work, gates = _applied(model, mask, spec.apply, dropped_layers)
    start = time.perf_counter()
    with torch.no_grad(), gate_heads(work, gates):
        lm = harness_model(work, tokenizer, spec.batch_size, progress)
        out = simple_evaluate(lm, tasks=list(spec.tasks), task_manager=tasks.manager, num_fewshot=spec.num_fewshot,
                              limit=spec.limit, bootstrap_iters=spec.bootstrap_iters,
                              log_samples=spec.loglikelihoods,
                              random_seed=spec.seed, numpy_random_seed=spec.seed, torch_random_seed=spec.seed,
                              fewshot_random_seed=spec.seed)
    seconds = time.perf_counter() - start
    if progress is not None:
        progress(1.0, "done")
    extra = {"loglikelihoods": loglikelihoods(out)} if spec.loglikelihoods else {}
    return {**report(out), **extra, "apply": spec.apply, "pruned_heads": 0 if mask is None else mask.n_pruned,
            "dropped_layers": sorted(int(i) for i in dropped_layers), "seconds": seconds}


REPORTED = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples",
            "config", "lm_eval_version", "transformers_version", "tokenizer_bos_token", "tokenizer_eos_token",
            "max_length")


def report(out: dict) -> dict:
    """The JSON-safe part of ``simple_evaluate``'s output (REPORTED keys): values JSON cannot write become text,
    NaN stays NaN (lm-eval writes "N/A" for a standard error it did not compute)."""
    return {key: _jsonable(out[key]) for key in REPORTED if key in out}


def loglikelihoods(out: dict) -> dict[str, list[list[float]]]:
    """Per task, per document (in document order), the log-likelihood lm-eval scored for each of its requests
    (each choice of a multiple-choice question), from ``simple_evaluate(..., log_samples=True)``'s samples."""
    return {task: [[float(resp[0]) if isinstance(resp, (list, tuple)) else float(resp)
                    for resp in sample["filtered_resps"]]
                   for sample in sorted(samples, key=lambda s: s["doc_id"])]
            for task, samples in out.get("samples", {}).items()}


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return str(value)


def result_value(results: dict, task: str, metric: str) -> float:
    """``results[task]["metric,filter"]`` of a ``run_lm_eval`` result (filter "none" unless ``metric`` names one:
    "acc_norm" or "exact_match,strict-match")."""
    key = metric if "," in metric else f"{metric},none"
    row = results["results"].get(task)
    if row is None or key not in row:
        known = sorted(k.split(",")[0] for k in (row or {}) if "," in k and "_stderr" not in k)
        raise HarnessError(f"lm-eval reported no {metric!r} for task {task!r}; it reported: "
                           f"{', '.join(known) or 'nothing for that task'}.")
    value = row[key]
    return float("nan") if value in (None, "N/A") else float(value)


# -- metrics for trajectories and protocols ---------------------------------------------------------------------------

def is_harness_metric(name: str) -> bool:
    """Whether ``name`` names an lm-eval number ("lm-eval:TASK/METRIC") rather than one of headprune's metrics."""
    return isinstance(name, str) and name.startswith(METRIC_PREFIX)


def parse_metric(name: str) -> tuple[str, str]:
    """"lm-eval:arc_easy/acc_norm" -> ("arc_easy", "acc_norm")."""
    body = name[len(METRIC_PREFIX):] if is_harness_metric(name) else None
    task, _, metric = (body or "").partition("/")
    if not task or not metric:
        raise HarnessError(f"metric {name!r}: accepted {METRIC_PREFIX}TASK/METRIC, e.g. "
                           f"{METRIC_PREFIX}arc_easy/acc_norm or {METRIC_PREFIX}demo_lm_cloze/acc.")
    return task, metric


def metric_tasks(names) -> tuple[str, ...]:
    """The distinct lm-eval tasks ``names`` read ("lm-eval:TASK/METRIC"), in order; checked (``parse_metric``)."""
    return tuple(dict.fromkeys(parse_metric(name)[0] for name in names))


def harness_metrics(model, tokenizer, mask: HeadMask | None, names, *, tasks: Tasks | None = None,
                    progress: Progress | None = None, dropped_layers=(), **spec) -> dict[str, float]:
    """lm-eval numbers of ``model`` under ``mask``, one per name ("lm-eval:TASK/METRIC"), from ONE lm-eval run of
    the tasks they name (two metrics of a task share its requests). ``spec``: the other ``HarnessSpec`` fields
    (limit, include, num_fewshot, batch_size, apply, seed); ``tasks`` reuses a resolved index (``resolve_tasks``)
    across calls, e.g. one per ratio of a trajectory or per cell of a protocol."""
    names = list(names)
    wanted = metric_tasks(names)
    if tasks is None or not set(wanted) <= set(tasks.spec.tasks):
        tasks = resolve_tasks(HarnessSpec(tasks=wanted, **spec), check_data=False)
    elif tasks.spec.tasks != wanted:   # only the tasks asked for: a run of the others would be wasted
        tasks = Tasks(dataclasses.replace(tasks.spec, tasks=wanted), tasks.manager)
    result = run_lm_eval(model, tokenizer, tasks, mask, progress, dropped_layers)
    return {name: result_value(result, *parse_metric(name)) for name in names}


def harness_metric(model, tokenizer, mask: HeadMask | None, name: str, *, tasks: Tasks | None = None,
                   progress: Progress | None = None, **spec) -> float:
    """One lm-eval number of ``model`` under ``mask`` (``harness_metrics`` for one name)."""
    return harness_metrics(model, tokenizer, mask, [name], tasks=tasks, progress=progress, **spec)[name]


def count_requests(tasks: Tasks, tokenizer) -> tuple[int, int]:
    """(requests, tokens) a run of ``tasks`` will score: each task's documents (``limit`` of them) turned into
    lm-eval requests, each request's context + continuation tokenized. What ``estimate.estimate_harness`` times."""
    spec = tasks.spec
    n_requests = n_tokens = 0
    for task in tasks.manager.load(list(spec.tasks))["tasks"].values():
        if spec.num_fewshot is not None and task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=spec.num_fewshot)
        elif task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=spec.seed)
        task.build_all_requests(limit=spec.limit)
        for instance in task.instances:
            n_requests += 1
            texts = [a for a in instance.args if isinstance(a, str)]   # (context, continuation) or (text,)
            n_tokens += 1 + sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts)
    return n_requests, n_tokens
