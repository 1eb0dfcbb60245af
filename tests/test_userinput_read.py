"""The one safe reader of a user's file (headprune.userinput.read_user_*): regular files only, real paths inside
the allowed roots, sizes and JSON depth bounded before reading or parsing -- each refusal an error naming the file."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from headprune.errors import HeadpruneError
from headprune.userinput import json_depth, read_user_bytes, read_user_json, read_user_text


def refusal(call) -> str:
    done = threading.Event()
    result: list[str] = []

    def run():
        try:
            call()
        except HeadpruneError as exc:
            result.append(str(exc))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10), "the reader hung"
    assert result, "the reader accepted what it must refuse"
    return result[0]


def test_fifo_device_socket_and_folder_are_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    try:
        assert "FIFO" in refusal(lambda: read_user_bytes(tmp_path / "fifo", "Plan file", "a plan"))
        assert "character device" in refusal(lambda: read_user_json(tmp_path / "zero", "Plan file", "a plan"))
        assert "socket" in refusal(lambda: read_user_text(tmp_path / "sock", "Lesson", "a TOML file"))
        assert "folder" in refusal(lambda: read_user_text(tmp_path, "Lesson", "a TOML file"))
    finally:
        sock.close()


def test_a_symlink_out_of_the_roots_is_refused_and_one_inside_is_read(tmp_path):
    inside, outside = tmp_path / "lessons", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (outside / "secret.toml").write_text("x = 1\n")
    (inside / "real.toml").write_text("y = 2\n")
    (inside / "escape.toml").symlink_to(outside / "secret.toml")
    (inside / "alias.toml").symlink_to(inside / "real.toml")
    message = refusal(lambda: read_user_text(inside / "escape.toml", "Lesson", "a TOML file", roots=(inside,)))
    assert "not inside" in message and str(inside) in message
    assert read_user_text(inside / "alias.toml", "Lesson", "a TOML file", roots=(inside,)) == "y = 2\n"
    (inside / "loop").symlink_to(inside / "loop")
    assert "symbolic links" in refusal(lambda: read_user_text(inside / "loop", "Lesson", "a TOML file"))


def test_size_is_bounded_before_reading_and_depth_before_parsing(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2000)
    assert "2,000 bytes" in refusal(lambda: read_user_bytes(big, "Plan file", "a plan", max_bytes=1000))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert "100000 deep" in refusal(lambda: read_user_json(deep, "Plan file", "a plan"))
    tricky = {"a": "[[[[{{{{", "b": [[1]], "c": "\\\"[["}
    (tmp_path / "ok.json").write_text(json.dumps(tricky))
    assert read_user_json(tmp_path / "ok.json", "Plan file", "a plan", max_depth=3) == tricky
    assert json_depth(json.dumps(tricky)) == 3   # the hand count: object > list > list; brackets in strings skipped
    (tmp_path / "latin.json").write_bytes(b'{"a": "\xe9"}')
    assert "not UTF-8" in refusal(lambda: read_user_json(tmp_path / "latin.json", "Plan file", "a plan"))
    assert "not found" in refusal(lambda: read_user_json(tmp_path / "none.json", "Plan file", "a plan"))


@pytest.mark.parametrize("bad", ["{", '{"a": }', "[1, 2"])
def test_broken_json_names_the_file(tmp_path, bad):
    (tmp_path / "p.json").write_text(bad)
    message = refusal(lambda: read_user_json(tmp_path / "p.json", "Plan file", "a plan"))
    assert "is not JSON" in message and "p.json" in message
