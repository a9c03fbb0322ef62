"""A subscription's webhook as its subscriber names it in /subscribe: `{"url": "https://...",
"batch": N}`. Only its form is checked here; where the URL may point (the operator's allowlist) is
the gateway's to check, since that needs the name resolved."""

from __future__ import annotations

from typing import NamedTuple

from yarl import URL

from veil.protocol.errors import ProtocolError

MAX_URL_LENGTH = 2048
MOST_BATCHED = 500  # deliveries in one POST at most (a gateway's write holds 512 lines, about 64 KiB, at most)


class WebhookRequest(NamedTuple):
    url: str  # normalised: what is POSTed to
    batch: int  # deliveries per POST at most


def parse_webhook(doc: object) -> WebhookRequest:
    if not isinstance(doc, dict) or not doc.keys() <= {"url", "batch"} or "url" not in doc:
        raise ProtocolError("webhook", 'an object: {"url": "https://...", "batch": N}, batch optional (1)')
    batch = doc.get("batch", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MOST_BATCHED:
        raise ProtocolError("webhook.batch", f"deliveries per request: a whole number from 1 to {MOST_BATCHED}")
    return WebhookRequest(webhook_url(doc["url"]), batch)


def webhook_url(text: object) -> str:
    """An absolute https URL without credentials or fragment, as it will be requested."""
    if not isinstance(text, str) or not 0 < len(text) <= MAX_URL_LENGTH or not text.isascii() or not text.isprintable():
        raise ProtocolError("webhook.url", f"an https URL of at most {MAX_URL_LENGTH} printable ASCII characters")
    try:
        url = URL(text)
        host = url.host
    except (ValueError, TypeError):
        raise ProtocolError("webhook.url", "not a URL") from None
    if url.scheme != "https":
        raise ProtocolError("webhook.url", "https only: deliveries are signed, and they are not sent in the clear")
    if not host:
        raise ProtocolError("webhook.url", "names no host")
    if url.user is not None or url.password is not None:
        raise ProtocolError("webhook.url", "holds credentials: deliveries are signed instead (Veil-Signature)")
    if url.fragment:
        raise ProtocolError("webhook.url", "holds a fragment (#...), which is never sent")
    return str(url)
