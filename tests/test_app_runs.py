"""The Protocol runs page: a results folder's cells and its table as they land (the status sums are the library's,
``headprune.protocol.schedule``; the page lays them out)."""

from __future__ import annotations

import os
import shutil

from app_support import ROOT, problems
from test_shards import tiny

from headprune.protocol import expand
from headprune.protocol.claims import Claims
from headprune.protocol.run import run_protocol
from headprune.protocol.schedule import landed_table, own_folder


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_the_runs_page_fills_in_as_cells_land(tmp_path, tiny_model_dir, tiny_csv, one_thread):
    from streamlit.testing.v1 import AppTest

    protocol = tiny(tmp_path, tiny_model_dir, tiny_csv)
    out = tmp_path / "out"
    own_folder(out, protocol)
    run_protocol(protocol, out, plots=False)
    keys = [c.key for c in expand(protocol)]
    held = tmp_path / "held"
    held.mkdir()
    later = [k for k in keys if "__r1" in k]   # repeat 1 has not landed yet
    for key in later:
        shutil.move(out / "cells" / f"{key}.json", held / f"{key}.json")
    claims = Claims(out, "worker A")
    assert claims.take(later[0])

    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "10_Runs.py"), default_timeout=120)
    at.run()
    assert not problems(at) and any("--out folder" in i.value for i in at.info)
    at.text_input(key="runs-folder").input(str(out)).run()
    assert not problems(at), problems(at)
    shown = metrics(at)
    n = len(keys)
    assert shown["done"] == f"{n - len(later)} / {n}" and shown["running"] == f"1 / {n}"
    assert shown["pending"] == f"{len(later) - 1} / {n}" and shown["time left"] != "unknown"
    table = at.dataframe[0].value
    assert list(table["repeats"]) == [row["repeats"] for row in landed_table(protocol, out)]
    assert set(table["repeats"]) == {1}                       # one repeat landed of each row
    waiting = at.dataframe[1].value
    assert f"worker A (pid {os.getpid()}" in waiting.loc[waiting["cell"] == later[0], "detail"].item()

    for key in later:   # repeat 1 lands
        shutil.move(held / f"{key}.json", out / "cells" / f"{key}.json")
    claims.close()
    at.run()
    shown = metrics(at)
    assert shown["done"] == f"{n} / {n}" and shown["pending"] == f"0 / {n}"
    table = at.dataframe[0].value
    assert set(table[table["criterion"] != "dense"]["repeats"]) == {2} and len(at.dataframe) == 1

    at.text_input(key="runs-folder").input(str(tmp_path)).run()
    assert any("not a protocol's results folder" in e.value for e in at.error)


def test_a_finished_smoke_run_shows_as_finished(tmp_path, one_thread):
    """Issue 35: a finished `headprune run --smoke` folder read as "0/13 done, no cell has landed yet" (its cells are
    the stand-ins', not the protocol file's) and a finished run as "time left: under a second"."""
    from streamlit.testing.v1 import AppTest

    from headprune.protocol import Protocol
    from headprune.protocol.smoke import run_smoke

    protocol = Protocol.read(ROOT / "protocols" / "demo.toml")
    out = tmp_path / "smoke"
    run_smoke(protocol, out)
    n = len(list((out / "cells").glob("*.json")))
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "10_Runs.py"), default_timeout=120)
    at.run()
    at.text_input(key="runs-folder").input(str(out)).run()
    assert not problems(at), problems(at)
    shown = metrics(at)
    assert n > 0 and shown["done"] == f"{n} / {n}" and shown["pending"] == f"0 / {n}"
    assert shown["time left"] == "none: finished" and any("Finished" in s.value for s in at.success)
    assert len(at.dataframe[0].value) > 0 and not any("No cell has landed" in i.value for i in at.info)
