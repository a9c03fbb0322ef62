"""The pipeline's class archive, with a real JVM: only an archive a JVM accepts whole is ever handed
to one (a truncated one crashes the JVM that maps it), a partial still being written is left alone,
and a cache others may write to is not used."""

from __future__ import annotations

import glob
import os
import subprocess
import time

import orjson
import pytest

from veil.config import Config
from veil.pipeline import class_archive


@pytest.fixture
def cache(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    return str(directory)


def _made_long_ago(path: str) -> None:
    then = time.time() - class_archive.SETTLED - 1
    os.utime(path, (then, then))


def _dump(plan: class_archive.Plan) -> None:
    """What a pipeline's JVM does at exit, on an empty class path (a JVM that only prints its version)."""
    java = class_archive._java()
    assert java is not None, "no java: Spark's prerequisite"
    class_archive.record(plan, "")
    subprocess.run([java, *plan.options, "-version"], check=True, capture_output=True)


def test_a_pipeline_with_no_archive_writes_one_and_the_next_start_uses_it(cache):
    first = class_archive.plan(cache)
    assert first.partial is not None and first.partial.startswith(cache + os.sep)
    assert f"-XX:ArchiveClassesAtExit={first.partial}" in first.options
    _dump(first)
    assert class_archive.plan(cache).options == ()  # just written: its JVM may still be writing it
    _made_long_ago(first.partial)
    used = class_archive.plan(cache)
    archives = glob.glob(os.path.join(cache, "*.jsa"))
    assert len(archives) == 1 and used.partial is None
    assert f"-XX:SharedArchiveFile={archives[0]}" in used.options
    assert os.listdir(cache) == [os.path.basename(archives[0])]  # the partial's note went with it


@pytest.mark.parametrize("damage", ["truncated", "flipped", "no note"])
def test_a_damaged_partial_is_removed_and_never_handed_to_a_jvm(cache, damage):
    plan = class_archive.plan(cache)
    assert plan.partial is not None
    _dump(plan)
    os.chmod(plan.partial, 0o600)
    if damage == "truncated":  # its pipeline killed while the JVM wrote it
        os.truncate(plan.partial, os.path.getsize(plan.partial) // 2)
    elif damage == "flipped":
        with open(plan.partial, "r+b") as handle:
            handle.seek(os.path.getsize(plan.partial) // 2)
            handle.write(b"\xff\x00\xff\x00")
    else:
        os.unlink(plan.partial + ".json")
    _made_long_ago(plan.partial)
    again = class_archive.plan(cache)
    assert not any(option.startswith("-XX:SharedArchiveFile") for option in again.options)
    assert glob.glob(os.path.join(cache, "*.jsa")) == []
    assert not os.path.exists(plan.partial)


def test_a_cache_others_may_write_to_is_not_used(cache, caplog):
    os.chmod(cache, 0o777)
    assert class_archive.plan(cache) == class_archive.Plan()
    assert "not this user's alone" in caplog.text


def test_a_cache_under_a_directory_others_may_replace_is_not_used(tmp_path, caplog):
    """Others could move the checked directory away and put one of theirs in its place; a sticky
    one (/tmp) lets them remove only what is theirs."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert class_archive.plan(str(shared / "cache")) == class_archive.Plan()
    assert f"others may write to {shared}" in caplog.text
    shared.chmod(0o777 | 0o1000)
    assert class_archive.plan(str(shared / "cache")).options != ()


def test_a_cache_the_jvm_cannot_name_or_a_partial_that_cannot_go_costs_only_the_archive(cache, tmp_path):
    colon = tmp_path / "a:b"
    colon.mkdir(mode=0o700)
    assert class_archive.plan(str(colon)) == class_archive.Plan()
    plan = class_archive.plan(cache)
    assert plan.partial is not None
    os.mkdir(plan.partial + "x.partial")  # a directory where a partial would be: no file to check or remove
    _made_long_ago(plan.partial + "x.partial")
    assert class_archive.plan(cache) == class_archive.Plan()


def test_the_note_never_names_the_program_that_checks_a_partial(cache, tmp_path):
    plan = class_archive.plan(cache)
    assert plan.partial is not None
    _dump(plan)
    trap = tmp_path / "ran"
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {trap}\n")
    fake.chmod(0o755)
    with open(plan.partial + ".json", "wb") as handle:  # an older note's shape, with a Java of its own
        handle.write(orjson.dumps({"java_home": str(tmp_path), "class_path": ""}))
    _made_long_ago(plan.partial)
    assert any(option.startswith("-XX:SharedArchiveFile") for option in class_archive.plan(cache).options)
    assert not trap.exists()


def test_the_cache_is_the_users_unless_configured_or_off(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert Config().class_cache_dir == str(tmp_path / "veil")
    assert Config(class_cache=str(tmp_path / "elsewhere")).class_cache_dir == str(tmp_path / "elsewhere")
    assert Config(class_cache="off").class_cache_dir is None
    assert class_archive.plan(None) == class_archive.Plan()


def test_the_note_names_the_class_path_only(cache):
    plan = class_archive.plan(cache)
    assert plan.partial is not None
    class_archive.record(plan, "/opt/spark/jars/a.jar")
    with open(plan.partial + ".json", "rb") as handle:
        assert orjson.loads(handle.read()) == {"class_path": "/opt/spark/jars/a.jar"}
    assert os.stat(plan.partial + ".json").st_mode & 0o077 == 0
