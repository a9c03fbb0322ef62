"""Spark's classes, archived once for the JVM's class-data sharing (CDS): every later pipeline maps
them from one file instead of loading and verifying them from Spark's jars again, which took about
a third of the pipeline's start on two cores (the JVM's start, Spark's first queries and jobs).

The JVM writes the archive itself, at the exit of a pipeline started without one
(-XX:ArchiveClassesAtExit), under a name of its own: a `.partial`, beside a note of the class path
it ran with. A later start promotes a partial to the archive once nothing has written to
it for SETTLED seconds, and only if a JVM given it alone accepts it whole (-Xshare:on and
-XX:+VerifySharedSpaces, which checks every region's checksum): a pipeline killed while its JVM
wrote leaves a truncated file, and a JVM that maps a truncated archive crashes where one that finds
a checksum or class path that does not match only does without. Pipelines started while no archive
is there write their own partials; the first promoted wins and the others are removed.

The archive is the operator's cache (`--class-cache`), like a compiler's: a directory that no one
but this user can write to or replace, since a class archive is code the JVM runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import logging
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import time

import orjson
import pyspark

log = logging.getLogger("veil.pipeline")
SETTLED = 10.0  # seconds a partial is left alone after its last write: its JVM may still write it
STALE = 7 * 86400.0  # seconds after which a note whose JVM never wrote its partial is removed
VALIDATE_TIMEOUT = 60.0
# every region checksummed as it is written and mapped (0.1-0.2 s for 160 MB); the JVM's own reports
# on what it archives and maps (a warning per class it skips) are not the operator's concern:
# whether the archive was used shows in how long the pipeline took to start
FLAGS = ("-XX:+VerifySharedSpaces", "-Xlog:cds=off", "-Xlog:cds+dynamic=off")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The JVM options of one pipeline's start, and the partial its JVM writes at exit, if any."""

    options: tuple[str, ...] = ()
    partial: str | None = None


def plan(directory: str | None) -> Plan:
    """Use the archive of this Java and Spark if there is one, after promoting any partial that is
    ready; else have this JVM write one, unless one was written a moment ago (the next start
    promotes it). No options without a cache directory or a Java to key the archive by, nor where
    the cache cannot be read or written: the archive only ever saves time."""
    java = _java()
    if directory is None or java is None or not _private_directory(directory):
        return Plan()
    name = os.path.join(directory, f"spark-classes-{_key(java)}")
    try:
        _promote(name, java)
        if os.path.isfile(name + ".jsa"):
            return Plan((f"-XX:SharedArchiveFile={name}.jsa", *FLAGS))
        if any(time.time() - _modified(path) < SETTLED for path in glob.glob(glob.escape(name) + ".*.partial")):
            return Plan()
    except OSError as exc:
        log.warning("no class archive: %s (%s)", exc.strerror, exc.filename)
        return Plan()
    partial = f"{name}.{secrets.token_hex(6)}.partial"
    return Plan((f"-XX:ArchiveClassesAtExit={partial}", *FLAGS), partial)


def record(dump: Plan, class_path: str) -> None:
    """The note a partial is validated by: the class path it holds classes of (a JVM accepts an
    archive only on the class path it was made on)."""
    if dump.partial is None:
        return
    with contextlib.suppress(OSError):  # a cache that cannot be written costs only the faster start
        descriptor = os.open(dump.partial + ".json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(orjson.dumps({"class_path": class_path}))


def _java() -> str | None:
    """The java Spark's launcher runs (JAVA_HOME's, else the PATH's), resolved through its links."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.isfile(java) else None


def _key(java: str) -> str:
    """Archives per Java and Spark installation: machines and virtualenvs that share a home would
    otherwise replace each other's (a JVM refuses an archive of another build or other jars)."""
    parts = [java, pyspark.__version__, os.path.dirname(pyspark.__file__)]
    for path in (java, os.path.join(os.path.dirname(os.path.dirname(java)), "lib", "server", "libjvm.so")):
        with contextlib.suppress(OSError):
            found = os.stat(path)
            parts.append(f"{found.st_size}:{found.st_mtime_ns}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _private_directory(directory: str) -> bool:
    """The cache and every directory above it: this user's or root's, and writable by no one else
    unless sticky (/tmp), so that no one else can put a directory of theirs in its place. Its path
    names one archive to the JVM, which reads a `:` in it as two."""
    if os.pathsep in directory:
        log.warning("no class archive: the JVM cannot name a file under %s (it holds %r)", directory, os.pathsep)
        return False
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        log.warning("no class archive: cannot use %s (%s)", directory, exc.strerror)
        return False
    target = path = os.path.realpath(directory)
    while True:
        found = os.stat(path)
        others = found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if found.st_uid not in (os.getuid(), 0) or (others and (path == target or not found.st_mode & stat.S_ISVTX)):
            log.warning("no class archive: %s is not this user's alone (others may write to %s)", directory, path)
            return False
        if path == os.path.dirname(path):
            return True
        path = os.path.dirname(path)


def _promote(name: str, java: str) -> None:
    """Every settled partial is validated once: the first valid one becomes the archive while there
    is none; the rest, and notes nobody could promote for STALE seconds, go."""
    for partial in glob.glob(glob.escape(name) + ".*.partial"):
        if time.time() - _modified(partial) < SETTLED:
            continue
        note = partial + ".json"
        if not os.path.isfile(name + ".jsa") and _valid(partial, note, java):
            with open(partial, "rb") as handle:  # on disk before it has the name every JVM maps
                os.fsync(handle.fileno())
            os.replace(partial, name + ".jsa")
            log.info("Spark's classes archived for the next starts: %s.jsa", name)
        for path in (partial, note):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    for note in glob.glob(glob.escape(name) + ".*.partial.json"):
        if time.time() - _modified(note) > STALE:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(note)


def _valid(partial: str, note: str, java: str) -> bool:
    """Checked by the Java the archive is keyed by, on the class path the note names: the note is
    data, never a program to run."""
    try:
        descriptor = os.open(note, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(descriptor, "rb") as handle:
            if os.fstat(handle.fileno()).st_uid != os.getuid():
                return False
            class_path = orjson.loads(handle.read())["class_path"]
        if os.stat(partial).st_uid != os.getuid() or not isinstance(class_path, str):
            return False
        archive = f"-XX:SharedArchiveFile={partial}"
        command = [java, "-cp", class_path, archive, "-Xshare:on", *FLAGS, "-version"]
        # a truncated archive crashes this JVM: its crash report goes to a directory that is then removed
        with tempfile.TemporaryDirectory() as scratch:
            result = subprocess.run(command, cwd=scratch, capture_output=True, timeout=VALIDATE_TIMEOUT)
    except (OSError, ValueError, KeyError, TypeError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _modified(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
