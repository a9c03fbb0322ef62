"""Users and scopes as small numbers, for a worker's life: the authorize stage's numpy keys are
built from them (user or publication * width + scope, publication * width + user)."""

from __future__ import annotations

from veil.security.scopes import WORLD

_users: dict[str, int] = {}
_scopes: dict[str, int] = {WORLD: 0}
SCOPE_WIDTH = 1 << 20  # scope numbers stay below this


def user_number(user: str) -> int:
    number = _users.get(user)
    if number is None:
        number = _users[user] = len(_users)
    return number


def users_numbered() -> int:
    return len(_users)


def scope_number(name: str) -> int:
    number = _scopes.get(name)
    if number is None:
        number = _scopes[name] = len(_scopes)
    return number
