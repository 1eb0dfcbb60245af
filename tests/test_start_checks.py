"""Issue 46 items 2 and 5: ``headprune dashboard`` starts offline, and a bad port or an unwritable cache is an
``error:`` line before anything starts.

The offline start runs the real command (``python -m headprune dashboard --headless --port P``, the shipped config
passed as flags) in a process whose network is monkey-patched by a ``sitecustomize`` module: every connection,
name lookup or datagram to an address other than this machine's loopback is written to a log and refused. A
control shows the guard sees what issue 46 saw (Streamlit's own address lookups, 8.8.8.8 and checkip.amazonaws.com).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from headprune.cli import dashboard as dashboard_cli
from headprune.cli import main as cli_main
from headprune.demos import build

ROOT = Path(__file__).resolve().parents[1]

GUARD = textwrap.dedent('''
    """Test guard (tests/test_start_checks.py): record and refuse every network use beyond this machine."""
    import ipaddress
    import os
    import socket

    LOG = os.environ["HEADPRUNE_NET_LOG"]


    def _local(host):
        if host is None:
            return True
        host = host.decode() if isinstance(host, bytes) else str(host)
        if host in ("", "localhost", "localhost.localdomain") or host.endswith(".localhost"):
            return True
        try:
            address = ipaddress.ip_address(host.split("%")[0].strip("[]"))
        except ValueError:
            return False
        return address.is_loopback or address.is_unspecified


    def _refuse(kind, target):
        with open(LOG, "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()} {kind} {target!r}\\n")
        raise OSError(101, f"network refused by the test guard: {kind} {target!r}")


    def _wrap(name, where):
        original = getattr(socket.socket, name)

        def guarded(self, address, *args):
            if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[where][0] if where is not None
                                                                               else address[0]):
                _refuse(name, address)
            return original(self, address, *args)

        setattr(socket.socket, name, guarded)


    for _name in ("connect", "connect_ex"):
        _wrap(_name, None)
    _sendto = socket.socket.sendto


    def _guarded_sendto(self, data, *args):
        address = args[-1]
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
            _refuse("sendto", address)
        return _sendto(self, data, *args)


    socket.socket.sendto = _guarded_sendto
    _getaddrinfo, _gethostbyname = socket.getaddrinfo, socket.gethostbyname


    def _guarded_getaddrinfo(host, *args, **kwargs):
        if not _local(host):
            _refuse("getaddrinfo", host)
        return _getaddrinfo(host, *args, **kwargs)


    def _guarded_gethostbyname(host):
        if not _local(host):
            _refuse("gethostbyname", host)
        return _gethostbyname(host)


    socket.getaddrinfo, socket.gethostbyname = _guarded_getaddrinfo, _guarded_gethostbyname
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def guarded_env(tmp_path: Path) -> tuple[dict, Path]:
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD, encoding="utf-8")
    log = tmp_path / "network.log"
    log.write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(guard), str(ROOT)]), "HEADPRUNE_NET_LOG": str(log),
           "HOME": str(tmp_path)}      # a fresh home: no Streamlit credentials file from earlier starts
    return env, log


def test_the_guard_sees_streamlits_address_lookups(tmp_path):
    """The control: Streamlit's own lookups (what issue 46 saw at start-up) are recorded and refused."""
    env, log = guarded_env(tmp_path)
    done = subprocess.run([sys.executable, "-c", "from streamlit import net_util as n; "
                           "print(n.get_internal_ip(), n.get_external_ip())"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["127.0.0.1", "None"]          # both lookups failed closed
    seen = log.read_text()
    assert "'8.8.8.8'" in seen and "checkip.amazonaws.com" in seen, seen


def test_headprune_dashboard_starts_without_a_single_network_attempt(tmp_path):
    env, log = guarded_env(tmp_path)
    port = free_port()
    out = tmp_path / "dashboard.log"
    with open(out, "w") as stream:
        # its own session: the test stops the command and the Streamlit it started together, by that group's id
        proc = subprocess.Popen([sys.executable, "-m", "headprune", "dashboard", "--headless", "--port", str(port)],
                                cwd=tmp_path, env=env, stdout=stream, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline, answered = time.time() + 120, {}
        while len(answered) < 2:
            assert proc.poll() is None and time.time() < deadline, out.read_text()
            for name, path in (("health", "/_stcore/health"), ("home", "/")):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
                        answered[name] = reply.read()
                except OSError:
                    time.sleep(0.5)
        assert answered["health"] == b"ok" and b"<html" in answered["home"].lower()
        time.sleep(1.0)      # what Streamlit does just after it answers (its welcome message) counts too
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    printed = out.read_text()
    assert f"http://localhost:{port}" in printed, printed      # the address it prints is this machine's own
    assert log.read_text() == "", log.read_text()


@pytest.mark.parametrize("port", ["-1", "0", "65536", "99999999999"])
def test_a_port_outside_1_65535_is_an_error_before_streamlit_starts(port, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(dashboard_cli.subprocess, "call", lambda argv: started.append(argv) or 0)
    assert cli_main(["dashboard", "--headless", "--port", port]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --port {port} must be an integer in [1, 65,535] (a TCP port)") and "free port" in err
    assert started == []


def test_a_port_in_use_is_an_error_before_streamlit_starts(capsys, monkeypatch):
    started = []
    monkeypatch.setattr(dashboard_cli.subprocess, "call", lambda argv: started.append(argv) or 0)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli_main(["dashboard", "--headless", "--port", str(port)]) == 2
    assert f"error: --port {port} cannot be used: another program serves on it" in capsys.readouterr().err
    assert started == []
    # a free port goes on to Streamlit, with the port and the offline options
    port = free_port()
    assert cli_main(["dashboard", "--headless", "--port", str(port)]) == 0
    assert len(started) == 1 and f"--server.port={port}" in started[0]
    assert {"--browser.serverAddress=localhost", "--browser.gatherUsageStats=false",
            "--server.showEmailPrompt=false"} <= set(started[0])


def test_streamlit_failing_is_a_non_zero_exit(capsys, monkeypatch):
    monkeypatch.setattr(dashboard_cli.subprocess, "call", lambda argv: 1)
    assert cli_main(["dashboard", "--headless"]) == 2
    assert "error: Streamlit stopped with exit code 1" in capsys.readouterr().err


def unwritable_places(tmp_path: Path) -> dict[str, Path]:
    """A file where the cache should be, a folder under a file, and a read-only folder (when this user cannot
    write there: root writes anywhere but on a read-only mount such as /sys)."""
    a_file = tmp_path / "cache-file"
    a_file.write_text("not a folder")
    places = {"a file": a_file, "under a file": a_file / "cache"}
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        (locked / "probe").write_text("")
        (locked / "probe").unlink()
        locked = Path("/sys/headprune-cache-test")     # root: a read-only file system instead
        locked.mkdir()
    except OSError:
        places["read-only"] = locked
    return places


def test_an_unwritable_cache_is_an_error_naming_it_before_any_build(tmp_path, monkeypatch):
    built = []
    for what, place in unwritable_places(tmp_path).items():
        monkeypatch.setenv("HEADPRUNE_CACHE", str(place))
        with pytest.raises(build.CacheError) as caught:
            build.build_cached(build.cache_dir() / "demo-x", lambda: built.append(1), "test demo", str)
        message = str(caught.value)
        assert str(place) in message and "HEADPRUNE_CACHE" in message and built == [], (what, message)


def test_docs_with_an_unwritable_cache_is_an_error_line(tmp_path, monkeypatch, capsys):
    import importlib.util

    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the docs command needs it before the cache)")
    place = unwritable_places(tmp_path)["a file"]
    monkeypatch.setenv("HEADPRUNE_CACHE", str(place))
    assert cli_main(["docs", "--build-only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: The headprune cache {place}/docs cannot be written") and "HEADPRUNE_CACHE" in err
