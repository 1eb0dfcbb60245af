"""Model & data: choose the model (classifier or language model) and the texts it is scored and evaluated on."""

from dataclasses import replace

import pandas as pd
import streamlit as st

from dashboard.config import (
    OTHER_DATA,
    SAME_DATA,
    Setup,
    memory_budget,
    role_sources,
    size_choice,
    use_memory_budget,
    use_setup,
)
from dashboard.store import build_workspace, save_upload
from dashboard.ui import DEMO_CHOICES, guard, page, plain, progress_bar
from headprune import viz
from headprune.data import NAMED_DATA, columns_of
from headprune.errors import DataError, HeadpruneError
from headprune.model.device import DTYPES, parse_device_map
from headprune.model.loading import NAMED_MODELS, declared_causal, is_lm_config, model_source_kind, peek_config
from headprune.model.memory import DEFAULT_SHARE

ws, sd = page("Model & data", "Everything runs locally. The demo needs no network; a Hugging Face id or "
                              "dataset is fetched only when the hub is reachable.")
setup = ws.setup
DEMO_MODELS = tuple(NAMED_MODELS)   # the registered demos (headprune.demos)
MODEL_SOURCES = {name: DEMO_CHOICES.get(name, name) for name in DEMO_MODELS} | \
    {"folder": "Local folder", "hub": "Hugging Face model id"}
DEVICES = {"auto": "auto (GPU if present)", "cpu": "CPU", "cuda": "GPU (CUDA)"}
PLACEMENTS = {"device": "all on the device above", "auto": "auto (accelerate: every GPU, then CPU, then disk)",
              "json": "a JSON device map"}
DTYPE_CHOICES = {"saved": "as saved"} | {name: name for name in DTYPES}


def language_model(spec: str) -> bool:
    """Whether ``spec`` is known, before loading, to be a causal language model: a named demo's declaration, a
    local folder's config.json (its architectures); a hub id or an unreadable folder is not known to be one."""
    if spec in NAMED_MODELS:
        return bool(declared_causal(spec))
    try:
        config = peek_config(spec) if spec else None
    except HeadpruneError:
        return False
    return bool(config) and is_lm_config(config)


def header_of(path: str) -> list[str]:
    """Column names of an uploaded file, for the pickers (empty when unreadable: loading then says why)."""
    try:
        return columns_of(path)
    except DataError:
        return []


def column_picker(label: str, columns: list[str], current: str | None, key: str, optional: bool) -> str | None:
    if columns:
        options = ["(auto-detect)"] + (["(none)"] if optional else []) + columns
        index = options.index(current) if current in options else 0
        choice = st.selectbox(label, options, index=index, key=key)
        return None if choice.startswith("(") else choice
    return st.text_input(label, value=current or "", key=key, placeholder="auto-detect") or None


st.subheader("Model")
kind = setup.model if setup.model in DEMO_MODELS else model_source_kind(setup.model)
model_kind = st.radio("Model source", list(MODEL_SOURCES), format_func=MODEL_SOURCES.get, horizontal=True,
                      index=list(MODEL_SOURCES).index(kind), key="md-model-kind")
model_spec = model_kind if model_kind in DEMO_MODELS else ""
if model_kind == "folder":
    model_spec = st.text_input("Folder with config.json and model.safetensors (e.g. one written by Export)",
                               value=setup.model if kind == "folder" else "", key="md-model-folder").strip()
elif model_kind == "hub":
    model_spec = st.text_input("Model id (e.g. textattack/bert-base-uncased-SST-2)",
                               value=setup.model if kind == "hub" else "", key="md-model-hub").strip()

st.subheader("Data")
dkind = "demo" if setup.data in NAMED_DATA else ("hub" if setup.data.startswith("hf:") else "upload")
# a demo reads its own data set (the LM demo: the reviews as unlabelled text); any other model the labelled rows
demo_data = model_spec if model_spec in NAMED_DATA else "demo"
# the demo data named for what it is (demo-circuit's rows are random word blocks, not reviews)
DATA_SOURCES = {"demo": f"Demo ({NAMED_DATA[demo_data].description})", "upload": "Upload CSV / TSV / JSONL / TXT",
                "hub": "Hugging Face dataset"}
data_kind = st.radio("Data source", list(DATA_SOURCES), format_func=DATA_SOURCES.get, horizontal=True,
                     index=list(DATA_SOURCES).index(dkind), key="md-data-kind")
# a demo LM also reads the multiple-choice sets registered for it (demo-lm-cloze: acc / acc_norm)
demo_sets = [demo_data] + [n for n, d in NAMED_DATA.items() if d.task == "multiple_choice" and n.startswith(demo_data)]
if data_kind == "demo" and len(demo_sets) > 1:
    demo_data = st.selectbox("Demo data set", demo_sets, key="md-demo-data",
                             index=demo_sets.index(setup.data) if setup.data in demo_sets else 0,
                             format_func=lambda n: f"{n}: {NAMED_DATA[n].description}")
data_spec, data_label, columns = demo_data, demo_data, []
if data_kind == "upload":
    upload = st.file_uploader("A UTF-8 file with a text column (and optionally a second text column for pairs) "
                              "and a label column; for a language model the text alone (TXT: one document per "
                              "line)", type=["csv", "tsv", "jsonl", "txt"], key="md-upload")
    if upload is not None:
        data_spec, data_label = save_upload(upload.name, upload.getvalue()), upload.name
        columns = header_of(data_spec)
    elif dkind == "upload":
        data_spec, data_label = setup.data, setup.data_label
        columns = header_of(data_spec)
    else:
        data_spec = ""
elif data_kind == "hub":
    name = st.text_input("Dataset: NAME[:CONFIG[:SPLIT]] (e.g. glue:sst2:validation) or a save_to_disk folder",
                         value=setup.data.removeprefix("hf:") if dkind == "hub" else "", key="md-data-hub").strip()
    data_spec = "hf:" + name.removeprefix("hf:") if name else ""
    data_label = data_spec
if data_kind != "demo":
    c1, c2, c3 = st.columns(3)
    with c1:
        text_col = column_picker("Text column", columns, setup.text_col, "md-text-col", optional=False)
    with c2:
        pair_col = column_picker("Second text column (pairs)", columns, setup.pair_col, "md-pair-col", optional=True)
    with c3:
        label_col = column_picker("Label column", columns, setup.label_col, "md-label-col", optional=False)
else:
    text_col = pair_col = label_col = None

def role_picker(column, label: str, current: str | None, key: str, help_text: str) -> str | None:
    """A data role's source: the data above (None), a named data set, or a typed spec."""
    options = role_sources(model_spec)
    index = 0 if current is None else (options.index(current) if current in options else len(options) - 1)
    choice = column.selectbox(label, options, index=index, key=key, help=help_text)
    if choice == OTHER_DATA:
        typed = column.text_input(f"{label}: spec", value=current if current not in options else "",
                                  key=f"{key}-spec", placeholder="data.csv or hf:glue:mnli").strip()
        return typed or None
    return None if choice == SAME_DATA else choice


st.subheader("Data roles")
st.caption("Criteria score heads on the **calibration** rows, choices (HIES's α, SAP's k and candidate filtering) "
           "are made on the **selection** rows, metrics are reported on the **evaluation** rows. Left on the data "
           "above, the roles are disjoint parts of it; from different sources, rows they share are refused. "
           "E.g. evaluation on `demo`, calibration on `demo:train`.")
r1, r2, r3 = st.columns(3)
calib_data = role_picker(r1, "Calibration data", setup.calib_data, "md-calib-data", "What criteria score heads on.")
select_data = role_picker(r2, "Selection data", setup.select_data, "md-select-data",
                          "Where choices are made; never the evaluation rows.")
eval_data = role_picker(r3, "Evaluation data", setup.eval_data, "md-eval-data",
                        "What is reported. An hf: dataset without a split never reads train.")
r4, r5, r6 = st.columns([2, 1, 1])
label_map, labels_by_position = None, False
if language_model(model_spec):   # it reads the text alone: no labels to match (the controls would do nothing)
    r4.caption("A language model predicts the next token of the text: there are no labels to map.")
else:
    label_map = r4.text_input("Label map (JSON), for models that name their labels only by position (LABEL_0, ...)",
                              value=setup.label_map or "", key="md-label-map",
                              placeholder='{"negative": 0, "positive": 1}').strip() or None
    labels_by_position = r5.checkbox("Match label names by position", value=setup.labels_by_position,
                                     key="md-labels-by-position",
                                     help="Accept the data's label order as the model's ids (LABEL_0, LABEL_1, ...).")
allow_untrained_head = r6.checkbox("Allow an untrained head", value=setup.allow_untrained_head,
                                   key="md-allow-untrained-head",
                                   help="Go on with a model whose task head was initialised at random on load "
                                        "(its scores are noise: fine-tune it first).")

st.subheader("Sizes and device")
c1, c2, c3, c4, c5 = st.columns(5)
SHRINKS = " Left unchanged, a default shrinks to fit small data, as in the CLI."
calib_size = c1.number_input("Calibration examples", min_value=0, value=int(setup.calib_size), step=16,
                             key="md-calib", help="Texts the criteria score heads on (default: at most half the "
                                                  "rows)." + SHRINKS)
eval_size = c2.number_input("Evaluation examples", min_value=1, value=int(setup.eval_size), step=50, key="md-eval",
                            help="Texts accuracy is measured on (disjoint from calibration; default: at most what "
                                 "calibration leaves)." + SHRINKS)
max_length = c3.number_input("Max length (tokens)", min_value=8, max_value=512, value=setup.max_length, step=16,
                             key="md-maxlen")
seed = c4.number_input("Seed", value=setup.seed, step=1, key="md-seed",
                       help="Seed of the calibration/evaluation split.")
device = c5.radio("Device", list(DEVICES), format_func=DEVICES.get, index=list(DEVICES).index(setup.device),
                  key="md-device")
select_size = st.number_input("Selection examples", min_value=0, value=int(setup.select_size), step=16,
                              key="md-select", help="Rows where choices are made (default: at most what calibration "
                                                    "and evaluation leave of a shared source)." + SHRINKS)
c6, c7 = st.columns([3, 2])
placed = "device" if setup.device_map is None else ("auto" if setup.device_map == "auto" else "json")
placement = c6.radio("Placement (models bigger than one device)", list(PLACEMENTS), format_func=PLACEMENTS.get,
                     index=list(PLACEMENTS).index(placed), horizontal=True, key="md-placement",
                     help="A device map places the layers through accelerate; the device choice is then ignored.")
device_map = None if placement == "device" else "auto"
if placement == "json":
    device_map = c6.text_area('Device map: {"module.name": device}, device = a GPU index, "cuda:N", "cpu" or '
                              '"disk"', value=setup.device_map if placed == "json" else "", key="md-device-map",
                              placeholder='{"model.embed_tokens": "cpu", "model.layers": "cpu", "lm_head": "cpu"}')
dtype = c7.radio("Weights", list(DTYPE_CHOICES), format_func=DTYPE_CHOICES.get, horizontal=True,
                 index=list(DTYPE_CHOICES).index(setup.dtype or "saved"), key="md-dtype",
                 help="bf16 / fp16 halve the memory of the weights; metrics are computed in float32 at least.")

budget_text = st.text_input("Memory budget", value=memory_budget() or "", key="md-memory-budget",
                            placeholder=f"default: {round(DEFAULT_SHARE * 100)}% of the free memory",
                            help="Memory scoring and evaluation may hold beyond the weights, e.g. 4GB, 512MB or 25% "
                                 "(of the free memory when a run starts). Batch sizes and KL's ablations per pass are "
                                 "planned to fit it; the results do not change. Applies at once, nothing reloads.")
with guard("That memory budget was not accepted — the previous one stays"):
    use_memory_budget(budget_text)

wanted = replace(setup, model=model_spec or "", data=data_spec, data_label=data_label, text_col=text_col,
                 pair_col=pair_col, label_col=label_col, calib_size=size_choice(calib_size, setup.calib_size),
                 eval_size=size_choice(eval_size, setup.eval_size),
                 # a link's evaluation rows (Setup.live_rows) hold until the user sets the size here
                 live_rows=setup.live_rows if int(eval_size) == int(setup.eval_size) else None,
                 select_size=size_choice(select_size, setup.select_size), calib_data=calib_data,
                 select_data=select_data, eval_data=eval_data, label_map=label_map,
                 labels_by_position=labels_by_position, allow_untrained_head=allow_untrained_head,
                 max_length=int(max_length), seed=int(seed), device=device,
                 device_map=device_map.strip() if device_map else None, dtype=None if dtype == "saved" else dtype)
if st.button("Load", type="primary", disabled=wanted == setup, key="md-load"):
    if not wanted.model:
        st.error("Give a model folder or a Hugging Face model id (or choose a demo).", icon="⚠️")
    elif not wanted.data:
        st.error("Upload a data file or name a dataset (or choose the demo data).", icon="⚠️")
    elif placement == "json" and not wanted.device_map:
        st.error('Write the device map as a JSON object, e.g. {"model.layers": "cpu", "lm_head": "disk"}, or '
                 "choose another placement.", icon="⚠️")
    else:
        with guard("Could not load that model and data — the previous ones stay loaded"):
            parse_device_map(wanted.device_map)  # a map naming an absent device is refused before any loading
            bar = progress_bar("loading")
            build_workspace(wanted, bar)
            bar.done()
            use_setup(wanted)
            st.rerun()

st.divider()
st.subheader("Loaded data")
setup_now: Setup = ws.setup
cols = ws.dataset.columns or {}
st.caption(f"{plain(ws.setup.data_label)}: {len(ws.dataset)} rows, task **{ws.dataset.task}**, columns "
           + ", ".join(f"{role} = **{plain(name)}**" for role, name in cols.items() if name) + ". "
           f"Split with seed {setup_now.seed}: {len(ws.calib)} calibration, {len(ws.eval)} evaluation examples.")
names = ws.dataset.label_names or []
preview = pd.DataFrame({"text": ws.eval.texts[:20]})
if ws.eval.pairs is not None:
    preview["pair"] = ws.eval.pairs[:20]
if ws.eval.choices is not None:  # multiple choice: the text is the context, the label the right choice's index
    preview["choices"] = [" | ".join(c) for c in ws.eval.choices[:20]]
if ws.eval.labels is not None:  # language-model text has none
    preview["label"] = [names[y] if ws.dataset.task == "classification" and y < len(names) else y
                        for y in ws.eval.labels[:20]]
left, right = st.columns([3, 1])
with left:
    st.dataframe(preview, width="stretch", hide_index=True, height=300)
    st.markdown("**Data roles** (what a run file records)")
    st.dataframe(pd.DataFrame(ws.role_rows()), width="stretch", hide_index=True)
    mapping = ws.mapping_line()
    if mapping:
        st.caption(plain(mapping))
    for note in ws.notes:
        st.info(plain(note), icon="ℹ️")
with right:
    st.markdown("**The model as loaded, on the evaluation split**")
    dense = ws.dense().to_dict()
    st.dataframe(viz.readable(pd.DataFrame({"metric": list(dense), "value": list(dense.values())})),
                 hide_index=True, width="stretch")
    if ws.dataset.task == "classification":
        counts = pd.Series([names[y] for y in ws.eval.labels]).value_counts()
        st.markdown("**Labels (evaluation)**")
        st.dataframe(counts.rename("examples"), width="stretch")
