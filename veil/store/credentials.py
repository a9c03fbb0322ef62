"""A store URL's password, kept out of what others on the machine or the cluster can read: process
command lines (world-readable), log lines, and the options of Spark's source (shown in its plans and
UI). The password goes to libpq through PGPASSWORD instead, which only the process itself and its
children (the local executors) hold; executors elsewhere take it from their own environment. (A
password in ~/.pgpass or PGPASSWORD, and none in the URL, is better still: then Veil never holds it
in a string.)

The URL is split as libpq reads it, not as `urllib` does: the password runs from the first colon of
the user part to the `@`, whatever it holds (`#`, `?`, `/`, `[`), and a `password` parameter wins
over it."""

from __future__ import annotations

import re
from urllib.parse import unquote

PASSWORD_ENV = "PGPASSWORD"
_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@]*):(?P<password>[^@]*)@(?P<rest>.*)", re.S
)
_SECRET_PARAMETERS = ("password", "sslpassword")


def without_password(url: str) -> tuple[str, str | None]:
    """The URL without its password (after the user name, or as a `password` parameter), and the
    password, decoded (None: it had none). An `sslpassword` parameter stays: libpq needs it there."""
    password = None
    found = _USERINFO.fullmatch(url)
    if found is not None:
        user = found["user"]
        url = f"{found['scheme']}{user + '@' if user else ''}{found['rest']}"
        password = unquote(found["password"])
    base, question, query = url.partition("?")
    if question:
        parameters = query.split("&")
        given = [unquote(p.partition("=")[2]) for p in parameters if p.partition("=")[0] == "password"]
        if given:
            password = given[-1]
            kept = [p for p in parameters if p.partition("=")[0] != "password"]
            url = base + ("?" + "&".join(kept) if kept else "")
    return url, password


def redacted(url: str) -> str:
    """The URL as a log line may show it: every password replaced by ***."""
    found = _USERINFO.fullmatch(url)
    if found is not None:
        url = f"{found['scheme']}{found['user']}:***@{found['rest']}"
    base, question, query = url.partition("?")
    if not question:
        return url
    parameters = [
        f"{p.partition('=')[0]}=***" if p.partition("=")[0] in _SECRET_PARAMETERS else p for p in query.split("&")
    ]
    return base + "?" + "&".join(parameters)
