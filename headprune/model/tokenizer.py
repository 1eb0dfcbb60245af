"""A tokenizer fitted to its model: a pad token by one rule, and the model's context as its length limit.

``loading.load_model`` calls :func:`prepare_tokenizer` once; batching (``headprune.data``) reads the result through
:func:`pad_token_of` and :func:`context_of`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import DataError
from .task import is_language_model

# tokenizer.model_max_length above this is transformers' "no limit known" sentinel, not a context length
UNBOUNDED_CONTEXT = 10**6


def declared_context(config) -> int | None:
    """Longest input a config declares (``max_position_embeddings``, else GPT-2's ``n_positions``; a multimodal
    model's ``text_config`` first), or None when it declares none (a missing, zero or non-integer value). ``config``:
    a transformers config, or the dict of a folder's config.json read before any weights load, so the checks made
    before and after loading read one rule."""
    def read(c, name):
        return c.get(name) if isinstance(c, Mapping) else getattr(c, name, None)

    config = read(config, "text_config") or config
    for name in ("max_position_embeddings", "n_positions"):
        value = read(config, name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_context(model) -> int | None:
    """Longest input the model's position embeddings allow (``declared_context`` of its config)."""
    return declared_context(model.config)


def prepare_tokenizer(tokenizer, model) -> None:
    """Fit ``tokenizer`` to ``model`` (in place; call once at load time): a pad token and the context length.

    Pad rule: the tokenizer's own pad token, else its EOS token, else its UNK token; with none of these there is
    nothing safe to pad with and batching several rows is refused (a DataError). Padding is masked by the
    attention mask, so reusing EOS for it does not hide real EOS tokens from the loss. A classifier whose config
    has no ``pad_token_id`` gets the tokenizer's, since decoder classifiers (``*ForSequenceClassification``)
    pool the last token that is not padding and find it by that id (with EOS as pad, a trailing real EOS counts as
    padding there, so such a classifier pools the token before it, as transformers does for GPT-2).
    ``tokenizer.model_max_length`` is capped at ``model_context(model)``, so ``make_batches`` truncates (and
    warns) at the model's context.
    """
    if tokenizer.pad_token is None:
        tokenizer.pad_token = pad_token_of(tokenizer)
    if getattr(model.config, "pad_token_id", None) is None and not is_language_model(model):
        model.config.pad_token_id = tokenizer.pad_token_id
    context = model_context(model)
    if context is not None and not tokenizer.model_max_length <= context:
        tokenizer.model_max_length = context


def pad_token_of(tokenizer) -> str:
    """The pad rule: the tokenizer's pad token, else its EOS token, else its UNK token (DataError: none)."""
    token = tokenizer.pad_token or tokenizer.eos_token or tokenizer.unk_token
    if token is None:
        raise DataError(f"{type(tokenizer).__name__} has no pad, EOS or UNK token to pad batches with. Give the "
                        "model folder a tokenizer that defines one of them.")
    return token


def context_of(tokenizer) -> int | None:
    """The tokenizer's length limit, or None when it has none (transformers' "no limit known" sentinel)."""
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit < UNBOUNDED_CONTEXT else None
