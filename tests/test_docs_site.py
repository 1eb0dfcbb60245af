"""The manual (issue 38): `headprune docs` builds the MkDocs site (mkdocs.yml sets strict: a broken link or a page
missing from the build fails it) offline, serves it, and the pages generated from the code list every command,
option and protocol key there is.

One build per module (~30 s on 2 shared cores), into a scratch cache."""

from __future__ import annotations

import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from headprune.cli import GROUPS, OTHER, build_parser, command_groups, command_help, main
from headprune.cli import docs as docs_cli
from headprune.errors import HeadpruneError
from headprune.protocol.spec import Protocol

ROOT = Path(__file__).resolve().parents[1]


def hooks() -> dict:
    """docs/hooks.py's functions (the mkdocs hook is a file, not a module of a package)."""
    return runpy.run_path(str(ROOT / "docs" / "hooks.py"))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """`python -m headprune docs --build-only` in a scratch cache: (its JSON, the cache folder)."""
    cache = tmp_path_factory.mktemp("cache")
    env = dict(os.environ, HEADPRUNE_CACHE=str(cache), PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1",
               OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "headprune", "docs", "--build-only"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout), cache


@pytest.fixture(scope="module")
def site(built) -> Path:
    return Path(built[0]["site"])


def test_the_site_is_built_once_per_version_of_its_sources(built, site, monkeypatch):
    result, cache = built
    assert result["built"] is True and (site / "index.html").is_file() and site.parent.parent == cache
    assert [p.name for p in site.parent.iterdir()] == [site.name]   # no staging folder left behind
    monkeypatch.setenv("HEADPRUNE_CACHE", str(cache))
    assert docs_cli.build_site() == (site, False)                     # cached: found, not rebuilt


def test_every_section_and_generated_page_is_in_the_site(site):
    for page in ("tutorials", "how-to", "reference", "explanation", "results", "reference/cli", "reference/protocol",
                 "reference/api", "reference/formats", "tutorials/dashboard", "tutorials/cli", "results/proofs",
                 "explanation/architecture", "explanation/gating-vs-cutting", "how-to/own-model-and-data"):
        assert (site / page / "index.html").is_file(), page
    assert (site / "assets" / "dashboard.png").is_file()   # README's picture, on the home page


def test_no_asset_comes_from_another_host(site):
    """Offline at view time: no script, stylesheet, font, image or frame loads from the network."""
    remote = re.compile(r"""<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)=["']?(?:https?:)?//""", re.I)
    css_remote = re.compile(r"""(?:url\(\s*["']?|@import\s+["'])(?:https?:)?//""", re.I)
    offenders = []
    for path in site.rglob("*"):
        if path.suffix == ".html":
            text = path.read_text(encoding="utf-8")
            offenders += [f"{path}: {m.group(0)}" for m in remote.finditer(text)
                          if "<link" not in m.group(0).lower() or "stylesheet" in text[m.start():m.start() + 300]
                          or "preconnect" in text[m.start():m.start() + 300]]
        elif path.suffix in (".css", ".js"):
            offenders += [f"{path}: {m.group(0)}" for m in css_remote.finditer(path.read_text(encoding="utf-8"))]
    assert not offenders, offenders[:5]
    assert "fonts.googleapis" not in (site / "index.html").read_text(encoding="utf-8")


def test_the_search_index_finds_the_manuals_topics(site):
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    text = " ".join(doc["title"] + " " + doc["text"] for doc in index["docs"])
    for term in ("SAP", "DuoAttention", "SLURM", "LABEL_k"):
        assert re.search(rf"\b{re.escape(term)}\b", text), term


def test_the_dashboards_help_links_reach_their_sections(site, monkeypatch):
    from dashboard.config import DOCS_URL, HELP_PAGES, help_url
    from dashboard.ui import PAGES

    assert {title for _, title, _, _ in PAGES} | {"headprune"} <= set(HELP_PAGES)
    for title, target in HELP_PAGES.items():
        page, _, anchor = target.partition("#")
        html = (site / page / "index.html").read_text(encoding="utf-8")
        assert not anchor or f'id="{anchor}"' in html, (title, target)
        assert help_url(title) == DOCS_URL + target
    monkeypatch.setenv("HEADPRUNE_DOCS_URL", "http://teacher:9000/manual")
    assert help_url("Prune") == "http://teacher:9000/manual/tutorials/dashboard/#prune"
    assert help_url("a page it does not list") == "http://teacher:9000/manual/"


def test_headprune_docs_serves_the_site_on_localhost(site):
    server = docs_cli.make_server(site, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/reference/cli/", timeout=30) as response:
            assert response.status == 200 and b"Command line" in response.read()
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(SystemExit):   # a port outside 1..65535 is refused by the parser, before anything builds
        build_parser().parse_args(["docs", "--port", "70000"])


# -- the reference pages against the code -----------------------------------------------------------------------

def help_text(argv: list[str], capsys) -> str:
    """What `python -m headprune ARGV --help` prints (the same parser, in process)."""
    with pytest.raises(SystemExit):
        main(argv + ["--help"])
    return capsys.readouterr().out


def sections(markdown: str) -> dict[str, str]:
    """"## heading" -> the text under it."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_help_groups_every_command_with_an_example_that_parses(capsys):
    top = help_text([], capsys)
    listed = re.findall(r"^  (\S+) {2,}", top.split("commands, by what they do:")[1], flags=re.M)
    commands = command_help(next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices))
    assert sorted(listed) == sorted(commands)
    assert OTHER not in top and all(title != OTHER for title, _ in command_groups(commands))
    examples = [example for _, members in GROUPS for _, example in members]
    assert all(f"e.g. {example}" in top for example in examples)
    for name, example in ((n, e) for _, members in GROUPS for n, e in members):
        assert build_parser().parse_args(shlex.split(example)[3:]).command == name


def test_the_cli_reference_lists_every_command_and_option_help_prints(capsys):
    page = sections(hooks()["cli_reference"]())
    top = help_text([], capsys)
    commands = re.findall(r"^  (\S+) {2,}", top.split("commands, by what they do:")[1], flags=re.M)
    assert commands and set(commands) <= set(page)
    for command in commands:
        text = help_text([command], capsys)
        # an option's line starts at column 2 ("  -h, --help", "  --out OUT"); wrapped help text is indented more
        options = {o for line in re.findall(r"^  -[^\n]*", text, flags=re.M)
                   for o in re.findall(r"(?:^|, )(-{1,2}[\w-]+)", line.strip())}
        assert "--help" in options and len(options) > 1 or command in ("criteria",)
        missing = [o for o in options if f"`{o}" not in page[command] and f", {o}" not in page[command]]
        assert not missing, (command, missing)


BASE = 'models = ["demo"]\nsparsities = [0.5]\n{top}\n[data.calib]\nsource = "demo"\n{role}\n[data.eval]\n' \
       'source = "demo"\n\n[[criteria]]\nname = "random"\n{criterion}\n'


def accepted(text: str) -> set[str]:
    """The keys the spec names in its "unknown key" error for ``text``."""
    with pytest.raises(HeadpruneError) as error:
        Protocol.parse(text, "probe.toml")
    return set(re.search(r"accepted: ([^.]*)\.", str(error.value)).group(1).split(", "))


def test_the_protocol_reference_lists_every_key_the_spec_accepts():
    page = sections(hooks()["protocol_reference"]())
    keys = {heading: set(re.findall(r"^\| `(\w+)` \|", text, flags=re.M)) for heading, text in page.items()}
    bogus = "no_such_key = 1"
    probes = {
        "top level": BASE.format(top=bogus, role="", criterion=""),
        "[data.ROLE]": BASE.format(top="", role=bogus, criterion=""),
        "[[criteria]]": BASE.format(top="", role="", criterion=bogus),
        "[[models]]": BASE.replace('models = ["demo"]\n', "").format(top="", role="", criterion="")
        + f'\n[[models]]\nmodel = "demo"\n{bogus}\n',
        "[trajectory]": BASE.replace("sparsities = [0.5]\n", "").format(top="", role="", criterion="")
        + f"\n[trajectory]\nstep = 1\n{bogus}\n",
        "[kv]": 'models = ["demo-lm"]\n[data.calib]\nsource = "demo-lm"\n[data.eval]\nsource = "demo-lm"\n'
                f'[kv]\nrules = ["random"]\nfull_shares = [0.5]\n{bogus}\n',
        "[recovery]": BASE.format(top="", role="", criterion="") + f'[data.train]\nsource = "demo:train"\n'
                                                                    f"[recovery]\n{bogus}\n",
        "[lm_eval]": BASE.format(top="", role="", criterion="") + f"[lm_eval]\n{bogus}\n",
        "[table]": BASE.format(top="", role="", criterion="") + f"[table]\n{bogus}\n",
    }
    for heading, text in probes.items():
        spec_keys = accepted(text)
        if heading == "top level":   # named in the error's list, refused on their own: headprune records them
            for key in ("text", "source"):
                with pytest.raises(HeadpruneError, match="recorded by headprune"):
                    Protocol.parse(BASE.format(top=f'{key} = "x"', role="", criterion=""), "probe.toml")
            spec_keys -= {"text", "source"}
        assert spec_keys and spec_keys <= keys[heading], (heading, spec_keys - keys[heading])
        assert keys[heading] <= spec_keys | {"data"}, (heading, keys[heading] - spec_keys)
    assert "must be an integer in [1, 1000]" in page["top level"]   # repeats: the limit as the check words it


def test_the_front_page_is_short_and_keeps_the_two_commands():
    """README.md: one page a newcomer reads in minutes (issue 38: at most 200 lines), with the two commands exactly
    as .ci/run and every guide has them, and a link to each section of the manual."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    assert "\nbash install.sh && python3 -m streamlit run app.py\n" in readme
    assert "\nbash install.sh --dev && python3 -m pytest -q -p no:cacheprovider\n" in readme
    for section in ("tutorials", "how-to", "reference", "explanation", "results"):
        assert f"](docs/{section}/" in readme, section
    generated = hooks()["GENERATED"]   # pages the build writes from the code
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file() or link.removeprefix("docs/") in generated, link
