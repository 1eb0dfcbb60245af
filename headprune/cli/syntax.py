"""``syntax``: dependency statistics (SAP §3.2) and the per-head syntactic profile of a model on the calibration
texts, as one JSON file (``--out``) and on stdout."""

from __future__ import annotations

import argparse
import time

from ..criteria.sap import DependencyStats
from ..syntax import DEFAULT_PIPELINE, QUERY_REDUCE, SyntacticProfile, collect_arc_attention, parse_dataset
from ..syntax.parse import load_parser, pipeline_key
from .common import (
    add_data_args,
    add_mask_arg,
    add_model_args,
    check_args,
    load_mask,
    load_model_and_data,
    summary,
    tqdm_progress,
)
from .output import add_force_arg, check_out_arg, write_out


def _top_k(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer (the top-k dependency labels), got '{text}'")
    return value


def cmd_syntax(args) -> dict:
    start = time.perf_counter()
    check_args(args, calib="reading dependency arcs")
    check_out_arg(args)
    nlp = load_parser(args.parser)                  # fail on a missing parser before loading the model
    loaded, _, _, info = load_model_and_data(args)
    calib = info["calib_data"]
    texts = calib.texts if calib.pairs is None else list(zip(calib.texts, calib.pairs))
    parses = parse_dataset(texts, nlp, args.parse_cache)
    data = collect_arc_attention(loaded.model, loaded.tokenizer, parses, load_mask(args, loaded), args.max_length,
                                 args.query_reduce, args.batch_size, tqdm_progress("attention on arcs"))
    result = {"model": args.model, "data": summary(info), "parser": pipeline_key(nlp),
              "dependency_stats": DependencyStats.from_parses(parses).to_json(args.k),
              "attention_threshold": data.threshold, "arcs": len(data.labels),
              "profile": SyntacticProfile.from_arcs(data, args.query_reduce).to_json(),
              "seconds": time.perf_counter() - start}
    return write_out(result, args)


def add_commands(sub) -> None:
    p = sub.add_parser("syntax", help="dependency-label statistics and per-head syntactic profile (spaCy parses)")
    add_model_args(p)
    add_data_args(p)
    add_mask_arg(p)
    p.add_argument("--out", help="write the JSON here too (PROFILE.json)")
    p.add_argument("--parser", default=DEFAULT_PIPELINE,
                   help=f"installed spaCy pipeline with a dependency parser (default: {DEFAULT_PIPELINE})")
    p.add_argument("--k", type=_top_k, default=5,
                   help="top-k labels for the SAP weights in the statistics, 1 or more (default: 5)")
    p.add_argument("--query-reduce", default="mean", choices=QUERY_REDUCE,
                   help="how a split word attends: mean over its sub-tokens (Clark et al., default), first, max")
    p.add_argument("--parse-cache", help="folder caching parses between runs (default: memory only)")
    add_force_arg(p)
    p.set_defaults(handler=cmd_syntax)
