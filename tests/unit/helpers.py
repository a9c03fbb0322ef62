from veil.store import Publication


def published(*bodies: bytes) -> list[Publication]:
    """Publications of these bytes by an anonymous publisher."""
    return [Publication(body) for body in bodies]
