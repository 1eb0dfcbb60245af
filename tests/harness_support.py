"""Helpers of the lm-eval tests: a word-level tokenizer for the tiny decoder, local multiple-choice tasks
(JSONL rows and an lm-eval YAML reading them by absolute path), and a model folder the CLI can load."""

from __future__ import annotations

import random

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from headprune.testing import tiny_decoder, write_choice_task

WORDS = ("the a film story book song was is felt seemed good bad long short dull bright warm cold slow quick and but "
         "very quite not never love war peace cats dogs rain sun night day end start it all nothing liked").split()
QUESTIONS = [
    ("the film was", ["good", "bad and long", "very dull", "quite warm"], 0),
    ("a story about", ["love", "war and peace", "cats", "the night"], 2),
    ("I liked", ["it", "nothing at all", "the end", "the start"], 1),
    ("the song felt", ["slow", "quick but warm", "cold", "bright"], 3),
    ("a book is", ["never dull", "quite long", "good", "bad"], 1),
    ("the day seemed", ["short", "long and slow", "warm", "very bright"], 0),
]


def word_tokenizer(end_token: bool = False) -> PreTrainedTokenizerFast:
    """A word-level tokenizer for the tiny decoder's 120-id vocabulary: ``<s> text`` as Llama's reads a row, or
    ``<s> text </s>`` (``end_token``) as the LM demo's does."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>" if end_token else "<s> $A",
                                                       special_tokens=[("<s>", 1), ("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def write_task(folder, name: str = "tiny_mc", questions=QUESTIONS):
    """A local lm-eval multiple-choice task: JSONL rows and a YAML reading them by absolute path."""
    return write_choice_task(folder, name, questions)


def random_questions(n: int, seed: int = 0) -> list[tuple[str, list[str], int]]:
    """``n`` seeded questions over WORDS: a 3-word context, four 1-3-word choices, a random answer."""
    rng = random.Random(seed)
    return [(" ".join(rng.choices(WORDS, k=3)), [" ".join(rng.choices(WORDS, k=rng.randint(1, 3))) for _ in range(4)],
             rng.randrange(4)) for _ in range(n)]


def model_folder(folder):
    """The tiny Llama (``tiny_decoder("llama")``, seed 0) and the word tokenizer saved where ``--model`` reads them."""
    model = tiny_decoder("llama")
    model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder
