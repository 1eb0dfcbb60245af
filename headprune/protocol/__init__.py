"""Protocols: one command per results table (``headprune run PROTOCOL.toml``).

    spec.py    the TOML file, validated once (keys and values, with their line numbers), before any model loads
    plan.py    cells (model x criterion x sparsity or order x repeat) and their work, offline
    cells.py   the one adapter onto data roles, metrics and scoring (switch the APIs there)
    run.py     computes the cells, resumable; writes the table, masks, plots and the run file
"""

from .plan import Cell, expand, plan
from .spec import KeyLines, Protocol, ProtocolError

__all__ = ["Cell", "KeyLines", "Protocol", "ProtocolError", "expand", "plan"]
