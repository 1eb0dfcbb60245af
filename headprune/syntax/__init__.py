"""Syntax layer: spaCy dependency parses, word <-> sub-token alignment, DependencyArcs, per-head syntactic profile.

    parse.py    load_parser, parse_texts (cached), Parse, Arc, ParserError, LanguageWarning
    align.py    token_words / word_attention (Clark et al. 2019 word-level attention), AlignmentError
    arcs.py     DependencyArcs (one text: words, arcs, word attention of every head), build_arcs, iter_arcs
    profile.py  collect_arc_attention (dataset pass used by SAP), SyntacticProfile, syntactic_profile
"""

from .align import QUERY_REDUCE, AlignmentError, word_attention
from .arcs import DependencyArcs, build_arcs, iter_arcs
from .parse import DEFAULT_PIPELINE, Arc, LanguageWarning, Parse, ParserError, load_parser, parse_text, parse_texts
from .profile import ArcData, SyntacticProfile, aggregate_arcs, collect_arc_attention, parse_dataset, syntactic_profile

__all__ = ["DEFAULT_PIPELINE", "QUERY_REDUCE", "AlignmentError", "Arc", "ArcData", "DependencyArcs",
           "LanguageWarning", "Parse", "ParserError", "SyntacticProfile", "aggregate_arcs", "build_arcs",
           "collect_arc_attention", "iter_arcs", "load_parser", "parse_dataset", "parse_text", "parse_texts",
           "syntactic_profile", "word_attention"]
