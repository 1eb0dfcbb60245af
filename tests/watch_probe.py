"""Which folders does Streamlit's file watcher watch?  Run as a script by tests/test_watcher.py:

    python watch_probe.py STREAMLIT_RUN_ARGS_JSON

in a checkout's folder. It parses ``streamlit run ARGS`` with Streamlit's own command line (so the config file of the
working directory, then the flags, set the options, as for a real ``streamlit run``), starts the watcher a browser
session starts (``LocalSourcesWatcher`` on the main script, with the modules under the checkout imported), waits
until its inotify watches hold still, and prints JSON: the option in force and the inode of every folder this
process watches (from /proc/self/fdinfo: inotify names folders by inode).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def watched_inodes() -> set[int]:
    """Inodes of every inotify watch this process holds."""
    inodes = set()
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            text = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:
            continue
        inodes.update(int(line.split("ino:")[1].split()[0], 16) for line in text.splitlines()
                      if line.startswith("inotify wd:"))
    return inodes


class Pages:
    """The pages manager a session hands the watcher: the main script is the only page."""

    def __init__(self, main_script: str):
        self.main_script_path = main_script

    def get_pages(self) -> dict:
        return {"main": {"script_path": self.main_script_path}}


def main() -> None:
    from streamlit import config
    from streamlit.watcher.local_sources_watcher import LocalSourcesWatcher
    from streamlit.web import bootstrap, cli

    ctx = cli.main_run.make_context("run", json.loads(sys.argv[1]))
    target = os.path.realpath(ctx.params.pop("target"))
    ctx.params.pop("args", None)
    bootstrap.load_config_options(flag_options=ctx.params)
    sys.path.insert(0, os.path.dirname(target))
    import probe_module  # noqa: F401  (a module in the checkout: the watcher registers it, as it does headprune's)

    watcher = LocalSourcesWatcher(Pages(target))
    watcher.update_watched_modules()
    seen, deadline = -1, time.time() + 30
    while time.time() < deadline:  # watchdog adds watches on its own threads: wait until their number holds
        time.sleep(1.0)
        now = len(watched_inodes())
        if now == seen:
            break
        seen = now
    print(json.dumps({"fileWatcherType": config.get_option("server.fileWatcherType"),
                      "watched": sorted(watched_inodes())}))
    watcher.close()


if __name__ == "__main__":
    main()
