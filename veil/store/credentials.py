"""A store URL's password, kept out of what others on the machine or the cluster can read: process
command lines (world-readable), log lines, and the options of Spark's source (shown in its plans and
UI). The password goes to libpq through PGPASSWORD instead, which only the process itself and its
children (the local executors) hold; executors elsewhere take it from their own environment. (A password in ~/.pgpass or
PGPASSWORD, and none in the URL, is better still: then Veil never holds it in a string.)"""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

PASSWORD_ENV = "PGPASSWORD"


def without_password(url: str) -> tuple[str, str | None]:
    """The URL without its password (after the user name, or as a `password` parameter), and the
    password, decoded (None: it had none)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = [value for key, value in query if key == "password"]
    if parts.password is None and not given:
        return url, None
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    kept = urlencode([(key, value) for key, value in query if key != "password"])
    bare = parts._replace(netloc=f"{name}@{host}" if name else host, query=kept).geturl()
    return bare, unquote(parts.password) if parts.password is not None else given[-1]


def redacted(url: str) -> str:
    """The URL as a log line may show it."""
    bare, password = without_password(url)
    if password is None:
        return url
    parts = urlsplit(bare)
    user, _, host = parts.netloc.rpartition("@")
    return parts._replace(netloc=f"{user}:***@{host}").geturl()
