"""The demos: small models headprune builds offline, once, with the data they are scored and evaluated on.

    corpus.py      the bundled Rotten Tomatoes snippets and the one seeded train / held-out split
    build.py       cache folder, training loop, atomic and locked builds
    classifier.py  "demo": MiniLM-L6 fine-tuned on the reviews (encoder, 6 x 12 heads)
    lm.py          "demo-lm": a 6-layer Llama LM with grouped-query attention trained on the same rows
    circuit.py     "demo-circuit": a 3-layer Llama LM whose repeated-block task needs an induction circuit
    needle.py      "demo-long": a 3-layer Llama LM that retrieves a key over 1k-4k tokens of filler (passkey)

Importing this package registers each demo as a named model (``headprune.model.loading.register_model``) and a
named data set (``headprune.data.register_dataset``), the way ``arch`` families register; ``headprune``'s own
``__init__`` imports it, so ``load_model("demo")`` and ``load_data("demo")`` work wherever headprune is used,
while neither the model nor the data layer ever imports a demo.
"""

from __future__ import annotations

from ..data import register_dataset
from ..model.loading import register_model
from . import circuit, classifier, lm, needle
from .corpus import fine_tuning, held_out

register_model("demo", "MiniLM-L6 sentiment classifier fine-tuned on Rotten Tomatoes (built offline once)",
               classifier.ensure_demo_model, causal=False)
register_model("demo-lm", "6-layer Llama language model, 8 query / 2 key-value heads (built offline once)",
               lm.ensure_demo_lm_model, causal=True)
register_dataset("demo", "held-out Rotten Tomatoes reviews (fresh / rotten)", held_out)
register_dataset("demo-lm", "the same held-out reviews as unlabelled text", lm.demo_lm_dataset, labelled=False)
register_dataset("demo:train", "the 9,000 reviews the demos were fine-tuned on (a separate split: calibration or "
                 "recovery data)", fine_tuning)
register_dataset("demo-lm:train", "the same 9,000 training reviews as unlabelled text", lm.demo_lm_train_dataset,
                 labelled=False)
register_dataset("demo-lm-cloze", "cloze questions from the held-out reviews for demo-lm: the start of a review "
                 "and four endings, its own and three others' (multiple choice)", lm.demo_lm_cloze_dataset,
                 labelled=False, task="multiple_choice")
register_model("demo-circuit", "3-layer Llama LM trained to copy repeated word blocks: an induction circuit "
               "(built offline once)", circuit.ensure_demo_circuit_model, causal=True)
register_dataset("demo-circuit", "repeated random word blocks, scored on the repeated half",
                 circuit.demo_circuit_dataset, labelled=False, language=False)
register_dataset("demo-circuit-choice", "induction questions for demo-circuit: a block, its repeat cut after a "
                 "word, and four words of the block; the right one follows that word (multiple choice)",
                 circuit.demo_circuit_choice_dataset, labelled=False, task="multiple_choice", language=False)
register_model("demo-long", "3-layer Llama LM trained to retrieve a key over 1k-4k tokens of filler: the passkey "
               "task at long contexts (built offline once)", needle.ensure_demo_long_model, causal=True)
register_dataset("demo-long", "filler texts for demo-long: the haystack of evaluate --long-context passkey",
                 needle.demo_long_dataset, labelled=False, language=False)
