"""The words on screen, explained in one place: criteria, head roles, dependency labels, metrics and other terms.

Each entry has the term as the UI shows it, a full name, one line and its source. Criteria and roles carry their
own one-line description and paper in their registries (``Criterion.description`` / ``.reference``,
``Role.description`` / ``.reference``): the glossary reads them there, so one text never has two copies, and adds
only the full name the registries do not hold. Dependency labels are explained by spaCy itself
(``spacy.explain``, its own glossary), for the labels of the parser the syntax views use.

Pages reach an entry from where its word appears: ``help_for(term)`` for a widget's ``help=``, ``role_legend()``
for the letters in grid cells, ``dependency_help(labels)`` for an arc figure's labels.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from .criteria import available, get
from .evaluation.metrics import GLUE_METRICS, METRIC_NAMES
from .roles import MARKS, NO_ROLE, ROLES
from .syntax.parse import load_parser

KINDS = ("criterion", "role", "dependency", "metric", "term")


@dataclass(frozen=True)
class Entry:
    """One glossary entry: ``term`` as shown on screen (a criterion's name, a role letter, a label)."""

    term: str
    kind: str          # one of KINDS
    name: str          # the full name
    text: str          # one line: what it means
    source: str = ""   # the paper or the library that defines it


# Full names of the criteria; their one line and paper come from the registry (``Criterion``).
CRITERION_NAMES = {
    "ad": "Attention deficit (AD)",
    "ae": "Attention entropy (AE)",
    "gnorm": "Gradient norm (Gnorm)",
    "greedy-gnorm": "Greedy gradient norm (Greedy-Gnorm)",
    "hies": "Head importance–entropy score (HIES)",
    "his": "Head importance score (HIS)",
    "kl": "KL-divergence head importance",
    "kwon": "Fast post-training pruning (Kwon et al. 2022)",
    "random": "Random order",
    "sap": "Syntactic attention pruning (SAP)",
    "sap-cf": "SAP with candidate filtering (SAP+CF)",
    "taylor": "Taylor importance score (TIS)",
}

# What each metric name the UI shows means (``evaluation.metrics``: METRIC_NAMES and GLUE's).
METRICS = {
    "accuracy": ("Accuracy", "share of examples whose predicted label is the right one; higher is better"),
    "f1": ("F1 score", "harmonic mean of precision and recall of the positive class (two classes); higher is better"),
    "macro_f1": ("Macro F1", "F1 of each class, averaged with equal weight; higher is better"),
    "mcc": ("Matthews correlation coefficient", "correlation of predicted and true labels, −1 to 1; 0 is chance"),
    "pearson": ("Pearson r", "linear correlation of predicted and true scores (regression); higher is better"),
    "spearman": ("Spearman ρ", "correlation of the ranks of two lists of numbers; 1 = same order, 0 = unrelated"),
    "mse": ("Mean squared error", "mean of (prediction − truth)² (regression); lower is better"),
    "loss": ("Loss", "mean cross-entropy of the right answer, −log p, in nats; lower is better"),
    "perplexity": ("Perplexity", "exp(mean next-token loss): how many words the model hesitates between on average; "
                   "lower is better, 1 is perfect"),
    "next_token_accuracy": ("Next-token accuracy", "share of positions where the model's top guess is the next "
                            "token; higher is better"),
    "acc": ("Choice accuracy (acc)", "share of multiple-choice questions whose highest-likelihood choice is right"),
    "acc_norm": ("Length-normalised choice accuracy", "acc with each choice's log-likelihood divided by its length "
                 "in characters (lm-evaluation-harness)"),
    "acc_bytes": ("Byte-normalised choice accuracy", "acc with each choice's log-likelihood divided by its length "
                  "in bytes (lm-evaluation-harness)"),
}

# Other words on the pages (figure titles, columns, axis labels).
TERMS = {
    "head": ("Attention head", "one of the parallel attention maps of a layer; each reads its own query, key and "
             "value projections", "Vaswani et al. (2017)"),
    "prune": ("Pruning a head", "switching a head off: its output is multiplied by 0 (gated) or its weights are cut "
              "out (surgery); the rest of the model is unchanged", "Michel et al. (2019)"),
    "mask": ("Head mask", "the grid of layers × heads, 1 = kept, 0 = pruned", "headprune"),
    "dense": ("Dense model", "the model with every head kept (as loaded)", "headprune"),
    "calibration": ("Calibration texts", "the texts criteria score heads on; kept apart from the evaluation texts",
                    "headprune"),
    "dep → head": ("Dependent → head", "a dependency arc: from a word to its grammatical head (the word it depends "
                   "on); an arc's colour is the attention the dependent gives its head", "Clark et al. (2019)"),
    "@k": ("Positional offset", "a positional head attends to the token k positions away: @-1 the previous token, "
           "@+0 itself, @+1 the next one", "Voita et al. (2019) §4.1"),
    "rank correlation": ("Rank correlation", "Spearman ρ between two criteria's scores over the live heads: do they "
                         "order the heads alike?", "Spearman (1904)"),
    "jaccard": ("Jaccard overlap", "|A ∩ B| / |A ∪ B| of the heads two criteria keep at one ratio; 1 = the same "
                "heads", "Jaccard (1912)"),
    "wauc": ("Weighted area under the curve (wAUC)", "area under the metric-vs-heads-pruned curve, weighted towards "
             "high pruning ratios; HIES picks its α by it", "HIES paper (hies.txt), App. C.3"),
    "ratio": ("Prune ratio r", "the share of all heads pruned", "headprune"),
    "stability": ("Stability", "share of examples whose answer stays the same when 10% of their words are dropped",
                  "headprune"),
    "Δ loss": ("Change in loss", "a token's loss under the pruned model minus its loss under the dense model: red "
               "= the pruned model finds the right token harder to predict", "headprune"),
    "evaluation": ("Evaluation texts", "the texts a metric is reported on, never scored on or chosen on (Model & "
                   "data sets how many)", "headprune"),
    "batches": ("Batches", "the evaluation texts are run a few at a time, a batch per forward pass; while a click's "
                "new metric comes in, \"3/8 batches\" says how many have been evaluated so far", "headprune"),
    "running estimate": ("Running estimate", "the metric over the batches evaluated so far, shown with its 95% "
                         "interval until the last batch gives the exact value", "headprune"),
    "95%": ("95% interval", "the range that holds the exact value 95 times in 100 (a confidence interval): the "
            "narrower it is, the more the running estimate can be trusted", "headprune.evaluation.progressive"),
    "KV cache": ("Key/value cache", "the keys and values a decoder keeps of every earlier token so each new token "
                 "is computed once; a streaming head keeps only the first S and the last W of them",
                 "Xiao et al. (2024), DuoAttention"),
}


def criterion_entries() -> list[Entry]:
    """One entry per registered criterion (``criteria.available``); a criterion registered without a full name in
    CRITERION_NAMES shows its own name."""
    return [Entry(name, "criterion", CRITERION_NAMES.get(name, name), get(name).description, get(name).reference)
            for name in available()]


def role_entries() -> list[Entry]:
    """One entry per role letter shown in grid cells (``roles.MARKS``), plus "no clear role"."""
    out = [Entry(MARKS[name], "role", name, ROLES[name].description, ROLES[name].reference) for name in MARKS]
    return out + [Entry("—", "role", NO_ROLE, "no role's score passes its threshold", "headprune.roles")]


def dependency_labels() -> list[str]:
    """The dependency labels the syntax views can show: the default parser's label set (spaCy loaded lazily)."""
    return sorted(load_parser().get_pipe("parser").labels)


# labels the default parser emits that spaCy's glossary lacks (spaCy warns W118): the ClearNLP guidelines' words
NOT_IN_SPACY = {"predet": "predeterminer (ClearNLP dependency guidelines; not in spaCy's glossary)"}


def explain_dependency(label: str) -> str:
    """spaCy's own explanation of a dependency label (``spacy.explain``), else NOT_IN_SPACY's, else ""."""
    import spacy  # deferred: an optional extra (headprune[syntax])
    with warnings.catch_warnings():   # W118 "term not found" is answered by NOT_IN_SPACY
        warnings.simplefilter("ignore", UserWarning)
        return spacy.explain(label) or NOT_IN_SPACY.get(label, "")


def dependency_entries(labels: list[str] | None = None) -> list[Entry]:
    """One entry per dependency label (default: the parser's label set), explained by spaCy."""
    return [Entry(label, "dependency", label, explain_dependency(label) or "no explanation in spaCy's glossary",
                  "spaCy (spacy.explain); Universal Dependencies / ClearNLP labels")
            for label in (dependency_labels() if labels is None else labels)]


def metric_names() -> list[str]:
    """Every metric name a page can show: each task kind's set and GLUE's."""
    return list(dict.fromkeys([*METRIC_NAMES, *(m for names in GLUE_METRICS.values() for m in names)]))


def metric_entries() -> list[Entry]:
    return [Entry(name, "metric", *METRICS.get(name, (name, "")), source="headprune.evaluation.metrics")
            for name in metric_names()]


def term_entries() -> list[Entry]:
    return [Entry(term, "term", name, text, source) for term, (name, text, source) in TERMS.items()]


def glossary(with_dependencies: bool = True) -> dict[str, list[Entry]]:
    """Every entry by kind (KINDS order). ``with_dependencies=False`` skips the parser (no spaCy load)."""
    return {"criterion": criterion_entries(), "role": role_entries(),
            "dependency": dependency_entries() if with_dependencies else [], "metric": metric_entries(),
            "term": term_entries()}


def help_for(term: str, kind: str | None = None) -> str:
    """A tooltip for ``term`` (a criterion's name, a role letter or name, a metric, a term): "Full name — one line
    (source)"; a dependency label when ``kind == "dependency"``. "" when the glossary does not know it."""
    if kind == "dependency":
        text = explain_dependency(term)
        return f"{term}: {text} (spaCy)" if text else ""
    for entry in criterion_entries() + role_entries() + metric_entries() + term_entries():
        if (kind is None or entry.kind == kind) and term in (entry.term, entry.name):
            return f"{entry.name} — {entry.text}" + (f" ({entry.source})" if entry.source else "")
    return ""


def role_legend() -> str:
    """The letters in head-grid cells, in one line: "P previous-token · D duplicate-token · … · @k positional"."""
    return " · ".join(f"**{MARKS[name]}{'k' if name == 'positional' else ''}** {name}" for name in MARKS)


def dependency_help(labels: list[str]) -> str:
    """spaCy's explanation of each label in ``labels`` (those shown on an arc figure), one per line."""
    return "\n".join(f"- **{label}**: {explain_dependency(label) or '—'}" for label in sorted(set(labels)))
