"""Protocols: one command per results table (``headprune run PROTOCOL.toml``).

    spec.py    the TOML file, validated once (keys and values, with their line numbers), before any model loads
    plan.py    cells (model x criterion x sparsity or order x repeat) and their work, offline
    cells.py   the one adapter onto data roles, metrics and scoring (switch the APIs there)
    compute.py   one cell computed from its inputs (``CellComputer``, one per model x repeat) and its fingerprint
    run.py     runs the pending cells (model and rows loaded, a Gate asked, compute, cell written), resumable;
               writes the table, masks, plots and the run file (``merge``)
    claims.py  a claim per cell (holder, heartbeat, stale takeover) and recorded failures
    schedule.py   units and shards (``--shard I/N``), a shard's run under claims, the folder's status
    executors.py  who runs the shards: local, a pool of processes, a submitit (SLURM) job array
"""

from .plan import Cell, expand, plan
from .spec import KeyLines, Protocol, ProtocolError

__all__ = ["Cell", "KeyLines", "Protocol", "ProtocolError", "expand", "plan"]
