"""Argument groups and loading shared by every command module (not itself a command module).

A command that scores or evaluates heads does::

    add_model_args(p); add_data_args(p); add_mask_arg(p)
    ...
    loaded, calib, evals, info = load_model_and_data(args)
    mask = load_mask(args, loaded)
"""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from ..data import check_source, parse_label_map
from ..errors import DataError, HeadpruneError
from ..evaluation.harness import user_code
from ..evaluation.metrics import check_metric_name, headline, metric_set
from ..limits import POSITIVE_INT, ROWS_PER_BATCH, SEED, TOKENS_PER_ROW, Interval
from ..model.device import DEVICES, parse_device_map
from ..model.loading import LoadedModel
from ..model.mask import HeadMask, dropped_layers
from ..model.memory import DEFAULT_SHARE, MemoryBudgetError, parse_budget
from ..model.task import REQUESTABLE
from ..userinput import NAME_MAX, PATH_MAX, shown, user_path
from ..workspace import DEFAULT_SELECT_SIZE, DefaultSize, Workspace

MODEL_HELP = "'demo' or 'demo-lm' (built offline on first use), a model folder, or a Hugging Face model id"
DATA_HELP = ("'demo', 'demo-lm', a .csv/.tsv/.jsonl file, a .txt file (one document per line, for a language "
             "model), or hf:NAME[:CONFIG[:SPLIT]] (a hub name or a save_to_disk folder)")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got '{text}'")
    return value


def _count_or_all(text: str) -> int | None:
    """A split size, or 'all' (None): every row the calibration set leaves."""
    return None if text.lower() == "all" else _count(text)


def checked(limit, what: str):
    """An argparse type: the value parsed as ``limit`` says (int or float) and inside it, else a message naming
    the accepted range."""
    def parse(text: str):
        try:
            value = int(text) if getattr(limit, "integer", False) else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'") from None
        problem = limit(value)
        if problem:
            raise argparse.ArgumentTypeError(f"{what} {value!r} {problem}")
        return value
    return parse


def _positive(text: str) -> int:
    value = _count(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def _bounded(limit):
    """An argparse type: a positive integer (else "expected a positive integer") inside ``limit`` (else its
    message, with the bound and why)."""
    def parse(text: str) -> int:
        value = _positive(text)
        if limit(value):
            raise argparse.ArgumentTypeError(f"{value} {limit(value)}")
        return value
    return parse


def _budget(text: str) -> int | float:
    """A ``--memory-budget`` (bytes, or a share of free memory), refused before anything loads."""
    try:
        return parse_budget(text)
    except MemoryBudgetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_memory_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory-budget", type=_budget, default=None, metavar="SIZE",
                   help="memory the computation may hold beyond the weights, e.g. 4GB, 512MiB or 25%% (of the free "
                        f"memory); batch sizes are planned to fit it (default: {round(DEFAULT_SHARE * 100)}%% of the "
                        "free memory)")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo", help=f"{MODEL_HELP} (default: demo)")
    p.add_argument("--device-map", default=None,
                   help="place the model with accelerate: 'auto' (spread over GPUs, CPU, disk) or a JSON object / "
                        "file {\"module.name\": device} with devices 0, \"cuda:1\", \"cpu\", \"disk\" "
                        "(overrides --device)")
    p.add_argument("--dtype", default=None, choices=("fp32", "bf16", "fp16"),
                   help="convert the weights on load (default: as saved)")
    p.add_argument("--allow-untrained-head", action="store_true",
                   help="go on with a model whose task head was initialised at random on load (a base or masked-LM "
                        "checkpoint read as a classifier); refused by default: fine-tune it first")


def add_data_args(p: argparse.ArgumentParser, calib_size: int = 128, eval_size: int | None = 500) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--data", default="demo", help=f"{DATA_HELP} (default: demo)")
    g.add_argument("--text-col", help="text column (default: auto-detect text, sentence, review, ...)")
    g.add_argument("--pair-col", help="second text column for sentence pairs (default: auto-detect)")
    g.add_argument("--label-col", help="label column (default: auto-detect label, labels, category, ...)")
    g.add_argument("--context-col", help="multiple-choice data: context column (default: a field map's -- HellaSwag "
                   "ctx, ARC question, PIQA goal, or context)")
    g.add_argument("--choices-col", help="multiple-choice data: a column holding the list of choices (a JSON list "
                   "in CSV; col.key for a list inside an object, e.g. choices.text), or several columns separated "
                   "by commas, one per choice (default: endings, choices.text, sol1,sol2 or choices)")
    g.add_argument("--answer-col", help="multiple-choice data: the right choice's index, digit or letter (default: "
                   "label, answerKey or answer)")
    g.add_argument("--task", choices=REQUESTABLE,
                   help="lm (next-token loss, perplexity; data needs no labels) or classification (default: "
                        "detected from the model's head)")
    g.add_argument("--calib-size", type=_count, default=DefaultSize(calib_size),
                   help=f"calibration examples for scoring heads (default: {calib_size}, at most half the data)")
    g.add_argument("--eval-size", type=_count_or_all, default=None if eval_size is None else DefaultSize(eval_size),
                   help=f"evaluation examples, or 'all' (default: {eval_size or 'all'}, at most what calibration "
                        "leaves)")
    g.add_argument("--calib-data", metavar="DATA",
                   help="what criteria score heads on (any data spec, e.g. demo:train; default: rows of --data)")
    g.add_argument("--select-data", metavar="DATA",
                   help="where choices are made: HIES's α, SAP's k and candidate filtering; never the evaluation "
                        "rows (default: rows of --data left after calibration and evaluation)")
    g.add_argument("--eval-data", metavar="DATA",
                   help="what is reported (any data spec; hf: without a split never reads train; default: --data)")
    g.add_argument("--select-size", type=_count, default=DefaultSize(DEFAULT_SELECT_SIZE),
                   help=f"selection examples (default: {DEFAULT_SELECT_SIZE}, at most what the other roles leave of "
                        "a shared source; 0 = choices on the calibration rows)")
    g.add_argument("--label-map", metavar="JSON|FILE",
                   help='which data label is which model id, e.g. \'{"negative": 0, "positive": 1}\' (or a JSON '
                        "file): needed when the model names its labels only by position (LABEL_0, ...)")
    g.add_argument("--labels-by-position", action="store_true",
                   help="accept matching the data's label names to the model's ids by their order")
    g.add_argument("--allow-overlap", action="store_true",
                   help="go on when roles read from different sources share rows (refused by default)")
    g.add_argument("--max-length", type=_bounded(TOKENS_PER_ROW), default=128,
                   help="truncate to this many tokens (default: 128)")
    g.add_argument("--batch-size", type=_bounded(ROWS_PER_BATCH), default=32,
                   help="examples per batch (default: 32)")
    g.add_argument("--seed", type=checked(SEED, "a seed"), default=0,
                   help="seed of the calibration/evaluation split (default: 0)")
    g.add_argument("--device", default="auto", choices=DEVICES, help="where to run (default: auto = CUDA if present)")


def add_mask_arg(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--mask", required=required,
                   help='head mask JSON: {"pruned": {"<layer>": [head, ...]}} and/or, for grouped-query attention, '
                        '{"pruned_groups": {"<layer>": [key/value group, ...]}} (0-based)')


def check_args(args, *, calib: str | None = None, evaluation: str | None = None,
               extra_metrics: tuple[str, ...] = ()) -> None:
    """Refuse, before any model loads or bar is drawn, the settings this command cannot run with.

    ``calib`` / ``evaluation`` name what needs a calibration / evaluation example (e.g. "scoring"): a size the
    user set to 0 is refused then (limits: ``limits.POSITIVE_INT``; a default size still shrinks to fit small data,
    and a size larger than the data is refused by the split, which knows the row count). A ``--mask`` file must
    exist and hold JSON (its heads are checked against the model once it is loaded). ``extra_metrics``: the
    ``--metric`` names this command reports beyond the tasks' (a trajectory's stability measures). Raises
    HeadpruneError.
    """
    if calib is not None and POSITIVE_INT(int(args.calib_size)):
        raise DataError(f"--calib-size {args.calib_size}: {calib} needs at least one calibration example. Accepted: "
                        f"--calib-size N with N {POSITIVE_INT.describe().removeprefix('an integer ')}.")
    if evaluation is not None and args.eval_size is not None and POSITIVE_INT(int(args.eval_size)):
        raise DataError(f"--eval-size {args.eval_size}: {evaluation} needs at least one example to evaluate on. "
                        f"Accepted: --eval-size N with N {POSITIVE_INT.describe().removeprefix('an integer ')}, "
                        "or all.")
    for option in ("data", "calib_data", "select_data", "eval_data"):
        spec = getattr(args, option, None)
        if spec is not None:
            try:
                check_source(spec)
            except DataError as exc:
                raise DataError(f"--{option.replace('_', '-')} {shown(spec)}: {exc}") from None
    sizes = {"calib": ("--calib-size", "calib_size"), "select": ("--select-size", "select_size"),
             "eval": ("--eval-size", "eval_size")}
    for role, (option, attr) in sizes.items():
        size = getattr(args, attr, None)
        if getattr(args, f"{role}_data", None) and size is not None and int(size) == 0:
            raise DataError(f"{option} 0 with --{role}-data {getattr(args, f'{role}_data')}: a role given its own "
                            f"data needs at least one example. Accepted: {option} N with N "
                            f"{POSITIVE_INT.describe().removeprefix('an integer ')}, or drop --{role}-data.")
    if getattr(args, "label_map", None):
        parse_label_map(args.label_map)
    if getattr(args, "mask", None):
        HeadMask.read_file(args.mask)
    check_metric_name(getattr(args, "metric", None), extra_metrics)
    parse_device_map(getattr(args, "device_map", None))   # a bad placement costs no loading


# options whose value is a path (or a data/model spec that may be one): checked as text by ``check_path_options``
PATH_OPTIONS = ("model", "teacher", "data", "calib_data", "select_data", "eval_data", "train_data", "mask", "scores",
                "out", "prune_out", "save_mask", "protocol", "parse_cache", "lm_eval_include")


def check_path_options(args) -> None:
    """Refuse, before any command runs, a path option the operating system could not even look up (a NUL byte, a
    name over 255 bytes, a path over 4096 bytes: ``userinput.path_problem``), so no ``OSError`` reaches the user
    from whichever function first asks the file system about it. ``cli.main`` calls this for every command."""
    for dest in PATH_OPTIONS:
        value = getattr(args, dest, None)
        for text in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
            user_path(text, f"--{dest.replace('_', '-')}", f"a path of at most {PATH_MAX} bytes whose file and "
                      f"folder names hold at most {NAME_MAX} bytes each (or a named model/data set, an hf: name)")


def warn_user_code(spec) -> None:
    """Say on stderr which Python files of the ``--lm-eval-include`` folders lm-eval will import (``!function``
    helpers of the requested tasks' YAML): they run as code, with this process's rights."""
    for task, files in user_code(spec).items():
        print(f"note: lm-eval task {task} imports Python code from your include folder: "
              f"{', '.join(map(str, files))} (its YAML's !function helpers); lm-evaluation-harness runs it as the "
              "task's code. Read it first if you did not write it.", file=sys.stderr)


def add_metric_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--metric", default=None, metavar="NAME",
                   help=f"headline metric {what}: accuracy, f1 (binary), macro_f1, mcc, pearson, spearman, mse, "
                        "loss, perplexity, next_token_accuracy, acc, acc_norm, acc_bytes (default: the task's "
                        "headline; GLUE data: GLUE's, e.g. mcc for CoLA, f1 for MRPC/QQP)")


def metric_choice(args, ws: Workspace, extra: tuple[str, ...] = ()) -> tuple[tuple[str, ...], str]:
    """(metric set, headline) of this run (``evaluation.metrics.metric_set`` / ``headline``) for the workspace's
    task (the data decides multiple choice) and its evaluation source (a GLUE name gives GLUE's set); ``--metric``
    must be one the task reports (or of ``extra``, the command's own: a trajectory's stability measures)."""
    source = ws.sources.get("eval") or args.data
    return (metric_set(ws.task, source, n_classes=ws.n_classes),
            headline(ws.task, getattr(args, "metric", None), source, n_classes=ws.n_classes, extra=extra))


def check_positive(value: int | None, option: str, what: str, doc: str, at_most: int | None = None) -> None:
    """Refuse ``option`` = ``value`` unless it is None or an integer >= 1 (``limits.POSITIVE_INT``), and at most
    ``at_most`` when given (``doc`` says why)."""
    limit = POSITIVE_INT if at_most is None else Interval(1, at_most, integer=True)
    if value is not None and limit(value):
        raise HeadpruneError(f"{option} {value}: {what} must be {limit.describe().removeprefix('an integer ')} "
                             f"({doc}).")


def load_mask(args, loaded: LoadedModel) -> HeadMask | None:
    """The mask file named by ``--mask`` for this model's grid, or None when no mask was given."""
    if not getattr(args, "mask", None):
        return None
    return HeadMask.load(args.mask, loaded.adapter.grid_shape, loaded.adapter.group_grid())


def mask_dropped_layers(args, loaded: LoadedModel) -> list[int]:
    """The layers the ``--mask`` file drops whole (SAP's layer rule, ``model.mask.dropped_layers``); [] without
    one."""
    if not getattr(args, "mask", None):
        return []
    return dropped_layers(HeadMask.read_file(args.mask), loaded.adapter.n_layers)


def build_workspace(args, calib_size: int | None = None, select_size: int | None = None) -> Workspace:
    """The ``Workspace`` the model and data arguments name (the dashboard builds the same object).

    ``calib_size`` / ``select_size`` override ``--calib-size`` / ``--select-size`` (0: the role is not read);
    sizes left at their defaults shrink to fit small data. What was chosen for the user (an hf: split, a label
    mapping by position or by --label-map) is printed on stderr as ``note: ...``.
    """
    label_map = parse_label_map(args.label_map) if getattr(args, "label_map", None) else None
    ws = Workspace.build(args.model, args.data, calib_data=getattr(args, "calib_data", None),
                         select_data=getattr(args, "select_data", None), eval_data=getattr(args, "eval_data", None),
                         text_col=args.text_col, pair_col=args.pair_col, label_col=args.label_col,
                         calib_size=args.calib_size if calib_size is None else calib_size, eval_size=args.eval_size,
                         select_size=getattr(args, "select_size", DefaultSize(DEFAULT_SELECT_SIZE))
                         if select_size is None else select_size,
                         label_map=label_map, labels_by_position=getattr(args, "labels_by_position", False),
                         allow_untrained_head=getattr(args, "allow_untrained_head", False),
                         allow_overlap=getattr(args, "allow_overlap", False), max_length=args.max_length,
                         batch_size=args.batch_size, seed=args.seed, device=getattr(args, "device", "auto"),
                         device_map=getattr(args, "device_map", None), dtype=getattr(args, "dtype", None),
                         task=getattr(args, "task", None), context_col=getattr(args, "context_col", None),
                         choices_col=getattr(args, "choices_col", None), answer_col=getattr(args, "answer_col", None))
    for note in ws.notes:
        print(f"note: {note}", file=sys.stderr)
    return ws


def load_model_and_data(args, calib_size: int | None = None,
                        select_size: int | None = None) -> tuple[LoadedModel, list[dict], list[dict], dict]:
    """Model, calibration batches, evaluation batches and an info dict, from the model and data arguments.

    ``info`` is ``Workspace.info()`` (model and data as given, the data roles under "roles") plus the TextDatasets
    under "calib_data", "select_data" and "eval_data" (raw texts, e.g. ``data.batch_texts(info["calib_data"],
    calib)``) and the selection batches under "select_batches" (where criteria make their choices:
    ``ScoringContext(select=...)``); ``summary(info)`` drops those for printing. ``calib_size`` /
    ``select_size`` override ``--calib-size`` / ``--select-size`` (0: the role is not read).
    """
    ws = build_workspace(args, calib_size, select_size)
    info = {**ws.info(), "model": args.model, "data": args.data, "calib_data": ws.calib, "eval_data": ws.eval,
            "select_data": ws.select, "select_batches": ws.select_batches}
    return ws.loaded, ws.calib_batches, ws.eval_batches, info


UNPRINTED = ("calib_data", "eval_data", "select_data", "select_batches")


def summary(info: dict) -> dict:
    """``info`` without its datasets and batches: what a command prints."""
    return {k: v for k, v in info.items() if k not in UNPRINTED}


OPEN_BARS: list = []   # bars drawn and not closed yet: an error or a cancel ends them first (end_bars)


def end_bars() -> None:
    """Close every bar still drawn, leaving it on its own line, so what is printed next (``error: ...``, a cancel's
    summary) starts on a fresh line instead of being glued to an unfinished bar."""
    while OPEN_BARS:
        bar = OPEN_BARS.pop()
        bar.leave = True   # a closed bar that is left ends its line; leave=False would only blank it
        bar.close()


def tqdm_progress(desc: str):
    """A ``progress(fraction, message)`` callback drawing a tqdm bar on stderr; it closes itself at 1.0."""
    bar = tqdm(total=1000, desc=desc, file=sys.stderr, leave=False, mininterval=0.5,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]")
    OPEN_BARS.append(bar)

    def update(fraction: float, message: str = "") -> None:
        bar.n = int(round(1000 * min(max(fraction, 0.0), 1.0)))
        bar.set_postfix_str(message, refresh=False)
        bar.refresh()
        if fraction >= 1.0:
            bar.close()
            if bar in OPEN_BARS:
                OPEN_BARS.remove(bar)

    return update


__all__ = ["checked", "check_args", "check_path_options", "warn_user_code", "check_positive", "add_model_args",
           "add_data_args", "add_mask_arg", "add_memory_arg", "add_metric_arg", "metric_choice", "load_mask",
           "mask_dropped_layers", "load_model_and_data", "build_workspace", "summary", "tqdm_progress", "end_bars"]
