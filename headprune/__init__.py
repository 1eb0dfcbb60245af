"""headprune: score, look at and prune the attention heads of transformers.

The package is layered; each layer imports only the ones below it (``pyproject.toml``'s import-linter contract
keeps it so, and ``docs/explanation/architecture.md`` draws it):

    cli                      the ``headprune`` command
    workspace | viz          one loaded model + data for the CLI and the dashboard | Plotly figures (draw only)
    demos                    the offline demo models and their data (registered by name below)
    roles                    what heads do: previous-token, induction, sink, positional, syntactic heads
    criteria                 head-importance criteria, one module per family
    trajectory               prune step by step in a score order and measure
    scoring | syntax         ScoreMap and the scorer protocol | dependency parses and word-level attention
    evaluation               metrics, live re-evaluation, stability, speed
    data                     texts in, batches out
    model                    heads: adapters, hooks, masks, gating, surgery, capture, loading
    errors | limits | provenance

Importing ``headprune`` registers the demos as named models and data sets (the composition root: the lower
layers look names up in their registries and never import a demo).
"""

from . import demos  # noqa: F401  (registers "demo", "demo-lm", ... with the model and data layers)
