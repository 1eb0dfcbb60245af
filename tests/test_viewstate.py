"""The link codec (headprune/viewstate.py): exact round trips of random views, compact masks, caps, bad links."""

import random

import pytest

from headprune.viewstate import KEYS, MAX_SENTENCE, KVView, ViewState, ViewStateError, format_heads, parse_heads

PAGES = ["model-and-data", "head-scores", "roles", "attention", "prune", "kv-cache"]
MODELS = ["classifier", "lm", "circuit"]       # any names: the codec only checks membership
NAMES = dict(pages=PAGES, models=MODELS, data=MODELS,
             criteria=["ae", "his", "random", "sap"], kv_rules=["razor", "duo", "random"])


def random_heads(rng: random.Random, shape, density: float):
    return [(layer, head) for layer in range(shape[0]) for head in range(shape[1]) if rng.random() < density]


def random_state(rng: random.Random, shape, kv_shape) -> ViewState:
    """A view with each key set or not at random (masks of every density, so both mask forms are drawn)."""
    def maybe(value):
        return value if rng.random() < 0.7 else None

    letters = "abcdefghijklmnopqrstuvwxyz ÄéЖ中,.;:!?&=+%#/~*-_'\"0123456789"
    kv = KVView(rule=rng.choice(NAMES["kv_rules"]), share=rng.randrange(0, 101), sink=rng.randrange(0, 65),
                window=rng.randrange(1, 4097), length=2 ** rng.randrange(8, 18),
                full=maybe(tuple(random_heads(rng, kv_shape, rng.random()))))
    if rng.random() < 0.3:      # a budget plan (HeadKV): a total and beta instead of a share and full heads
        kv = KVView(rule=kv.rule, share=None, sink=kv.sink, window=kv.window, length=kv.length,
                    budget=rng.randrange(0, 2**24 + 1), beta=rng.choice([1.0, 2.0, 1.005, 1e6, 1 + rng.random()]))
    lesson = rng.random() < 0.7     # a lesson and its step come together
    return ViewState(
        page=maybe(rng.choice(PAGES)), model=maybe(rng.choice(NAMES["models"])), data=maybe(rng.choice(NAMES["data"])),
        mask=maybe(tuple(random_heads(rng, shape, rng.choice([0.0, 0.05, 0.5, 0.95, 1.0])))),
        head=maybe((rng.randrange(shape[0]), rng.randrange(shape[1]))),
        criteria=maybe(tuple(rng.sample(NAMES["criteria"], rng.randrange(1, 5)))),
        criterion=maybe(rng.choice(NAMES["criteria"])), rows=maybe(rng.choice([1, 64, 500, 10**6])),
        ratio=maybe(rng.choice([0.0, 1.0, 0.5, rng.random()])),
        sentence=maybe("".join(rng.choice(letters) for _ in range(rng.randrange(1, 80)))),
        roles=maybe(rng.random() < 0.5), kv=maybe(kv),
        lesson=rng.choice(["induction", "a", "lesson-2"]) if lesson else None,
        step=rng.randrange(0, 1000) if lesson else None)


@pytest.mark.parametrize("shape", [(6, 12), (3, 8), (1, 1), (32, 32)])
def test_random_views_round_trip_exactly(shape):
    rng = random.Random(35 + shape[0])
    kv_shape = (shape[0], max(1, shape[1] // 4))
    for _ in range(150):
        state = random_state(rng, shape, kv_shape)
        query = state.to_query(shape, kv_shape)
        assert set(query) <= set(KEYS)
        back, problems = ViewState.from_query(query, **NAMES, shape=shape, kv_shape=kv_shape)
        assert problems == [] and back == state, (query, problems)


def test_masks_without_a_shape_round_trip_in_the_plain_form():
    rng = random.Random(7)
    for _ in range(100):
        heads = tuple(sorted(set(random_heads(rng, (12, 16), rng.random()))))
        text = format_heads(heads)
        assert "*" not in text and "~" not in text
        assert parse_heads(text) == heads


def test_long_masks_stay_short():
    shape = (32, 32)
    everything = [(layer, head) for layer in range(32) for head in range(32)]
    assert format_heads(everything, shape) == "~"                       # the complement of nothing
    assert format_heads([h for h in everything if h != (5, 7)], shape) == "~5.7"
    assert format_heads([(layer, 3) for layer in range(32)], shape) == "*.3"
    assert format_heads([(2, h) for h in range(32)] + [(3, h) for h in range(32)], shape) == "2-3.*"
    assert format_heads([(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]) == "0-1.1-3"
    assert format_heads([(0, 3), (2, 5)]) == "0.3,2.5"                  # the present form for a few heads
    # half of a big grid at random: the compact text is never longer than the plain list of heads
    rng = random.Random(3)
    half = random_heads(rng, shape, 0.5)
    assert len(format_heads(half, shape)) <= len(",".join(f"{a}.{b}" for a, b in half))
    assert len(format_heads(half, shape)) < 3000


def test_parse_heads_reads_every_form():
    assert parse_heads("0-2.1,4.*", (6, 3)) == ((0, 1), (1, 1), (2, 1), (4, 0), (4, 1), (4, 2))
    assert parse_heads("~*.0-1", (2, 3)) == ((0, 2), (1, 2))
    assert parse_heads("1.1,1.1,0.0") == ((0, 0), (1, 1))
    for bad in ("1-2", "a.b", "1.", ".1", "3-1.0", "1.2-", "٣.1", "12345.0", "0.0;1.1"):
        with pytest.raises(ValueError):
            parse_heads(bad)
    for needs_shape in ("*.1", "~0.1"):
        with pytest.raises(ValueError, match="shape|size"):
            parse_heads(needs_shape)
    with pytest.raises(ValueError, match="outside the 6 x 12 grid"):
        parse_heads("7.99", (6, 12))


def test_bad_links_keep_the_rest_and_say_what_was_dropped():
    junk = "x" * 10_000
    params = {"page": "nowhere", "model": "/etc/passwd", "data": "hf:imdb", "mask": "0.1,0.99", "head": "9.1",
              "ratio": "7", "criteria": "ae,nope", "roles": "maybe", "kv": "razor_25_4_16", "lesson": "../x",
              "step": "1e3", "sentence": junk, junk: "1", "zz": "1"}
    state, problems = ViewState.from_query(params, **NAMES, shape=(6, 12))
    assert state == ViewState(criteria=("ae",))
    text = "\n".join(problems)
    for named in ("page='nowhere'", "model='/etc/passwd'", "data='hf:imdb'", "mask='0.1,0.99'", "head='9.1'",
                  "ratio='7'", "'nope'", "roles='maybe'", "kv='razor_25_4_16'", "lesson='../x'", "step='1e3'",
                  "sentence is 10,000 characters", "unknown keys"):
        assert named in text, named
    assert len(problems) == 13 and all("\n" not in line and len(line) < 400 for line in problems)
    # accepted values are named: what a teacher should write instead
    assert "not one of classifier, lm, circuit" in text and "[0, 1]" in text


def test_a_value_over_its_cap_is_dropped_whatever_it_is():
    ok, problems = ViewState.from_query({"sentence": "é" * MAX_SENTENCE}, **NAMES)
    assert ok.sentence == "é" * MAX_SENTENCE and not problems
    state, problems = ViewState.from_query({"mask": "0.0," * 2000, "criteria": ",".join(["ae"] * 2000)}, **NAMES)
    assert state == ViewState() and len(problems) == 2 and "at most 4,000" in problems[0]
    # a range can't expand into millions of heads
    state, problems = ViewState.from_query({"mask": "0-9999.0-9999"}, **NAMES)
    assert state.mask is None and "more than" in problems[0]


def test_values_from_a_query_string_list_and_without_a_shape():
    state, problems = ViewState.from_query({"page": ["roles", "prune"], "head": "1.4", "mask": "0.3"}, **NAMES)
    assert state.page == "prune" and state.head == (1, 4) and state.mask == ((0, 3),) and not problems
    state, problems = ViewState.from_query({"mask": "*.1"}, **NAMES)        # '*' needs the grid: said, dropped
    assert state.mask is None and "size" in problems[0]


def test_a_view_is_checked_when_built():
    for bad in (dict(ratio=7.0), dict(ratio=float("nan")), dict(head=(-1, 0)), dict(step=1000), dict(roles=1),
                dict(lesson="A B"), dict(sentence="a\x00b"), dict(criteria=()), dict(page=""), dict(mask=[(0,)])):
        with pytest.raises(ViewStateError):
            ViewState(**bad)
    with pytest.raises(ViewStateError, match="length"):
        KVView(rule="razor", share=25, sink=4, window=16, length=1000)
    with pytest.raises(TypeError):
        ViewState("prune")                                                   # keyword-only
    assert ViewState(mask=[(2, 1), (0, 3), (2, 1)]).mask == ((0, 3), (2, 1))


def test_a_lesson_without_its_step_and_a_step_without_its_lesson_are_dropped_and_said():
    """Issue 46 item 7: neither opens anything alone; each is named in one line, the rest of the link applies."""
    state, problems = ViewState.from_query({"lesson": "induction", "page": "prune"}, **NAMES)
    assert state == ViewState(page="prune") and len(problems) == 1
    assert "lesson='induction' dropped" in problems[0] and "step=1" in problems[0]
    state, problems = ViewState.from_query({"step": "2", "head": "1.1"}, **NAMES)
    assert state == ViewState(head=(1, 1)) and len(problems) == 1 and "step=2 dropped" in problems[0]
    state, problems = ViewState.from_query({"step": "2", "lesson": "induction"}, **NAMES)
    assert state == ViewState(lesson="induction", step=2) and not problems


def test_rows_and_the_prune_criterion_are_carried_within_their_limits():
    """The evaluation rows (issue 45 item 3) and the Prune page's criterion (item 8): read back exactly, a value
    outside what a link accepts dropped with what is accepted."""
    state = ViewState(rows=64, criterion="his")
    assert state.to_query() == {"criterion": "his", "rows": "64"}
    assert ViewState.from_query(state.to_query(), **NAMES) == (state, [])
    for bad, said in (("0", "[1, 1,000,000]"), ("1000001", "[1, 1,000,000]"), ("-3", "whole number"),
                      ("6.4", "whole number"), ("٣", "whole number")):
        state, problems = ViewState.from_query({"rows": bad}, **NAMES)
        assert state.rows is None and len(problems) == 1 and said in problems[0], (bad, problems)
    state, problems = ViewState.from_query({"criterion": "nope"}, **NAMES)
    assert state.criterion is None and "not one of ae, his, random, sap" in problems[0]
    for bad in (dict(rows=0), dict(rows=True), dict(rows=2.0), dict(criterion="")):
        with pytest.raises(ViewStateError):
            ViewState(**bad)


def test_a_kv_budget_plan_reads_back_and_a_bad_one_is_refused():
    plan = KVView(rule="razor", share=None, sink=4, window=16, length=4096, budget=96, beta=2.0)
    assert plan.text() == "razor_b96-2.0_4_16_4096" and KVView.parse(plan.text()) == plan
    for bad in ("razor_b96_4_16_4096", "razor_b96-0.5_4_16_4096", "razor_b99999999999-2_4_16_4096",
                "razor_b96-2.0_4_16_4096_0.1", "razor_b-2_4_16_4096"):
        with pytest.raises(ViewStateError):
            KVView.parse(bad)
    with pytest.raises(ViewStateError, match="no share"):
        KVView(rule="razor", share=25, sink=4, window=16, length=4096, budget=96, beta=2.0)
