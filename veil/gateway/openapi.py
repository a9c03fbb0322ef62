"""The REST API described in OpenAPI 3.1 (`GET /openapi.json`): every endpoint, its body, its
answers and its errors, so that clients can be generated and the API fuzzed against it. The test
suite runs schemathesis against a live broker with this document, which keeps it true: an answer
the document does not allow (a status, a media type, a body) fails the suite.

Written by hand rather than derived from the parsers: these validate by hand, to name the field at
fault and to stop hostile input early, so there is no schema to derive from; the document states
the shapes, the parsers the finer rules (satisfiability, limits, who may do what).
"""

from __future__ import annotations

from functools import cache

import orjson
from aiohttp import web

from veil import __version__
from veil.protocol.limits import DEFAULT
from veil.protocol.reserved import MAX_KEY
from veil.protocol.subscriptions import LATEST_SINCE_MS, MAX_CREDENTIAL_LENGTH, MAX_ID_LENGTH, OPERATORS
from veil.protocol.webhooks import MAX_URL_LENGTH, MOST_BATCHED
from veil.store import DEAD_LETTER_REASONS

JSON = "application/json"
Schema = dict[str, object]

ERROR_MEANINGS = {
    400: "the request is malformed; `field` names what is wrong",
    401: "the credentials are missing or not proved",
    403: "the client may not do this",
    404: "what the request names does not exist",
    408: "the body did not arrive within the read timeout",
    409: "the request conflicts with the current state (a stale key or registry version, a taken id)",
    413: "the request is larger than a limit (body, lines of a batch, attributes, constraints, rules)",
    428: "the change must name the registry version it was made from (X-Registry-Version)",
    429: "a per-client limit (which the message names): the client's subscriptions, or its replay in progress",
    503: "the broker sheds load or its store cannot take writes now: retry after `Retry-After` seconds",
}
BODY_ERRORS = (400, 401, 403, 408, 413, 503)


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(properties: dict[str, Schema], required: tuple[str, ...] = (), closed: bool = True) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


STRING: Schema = {"type": "string"}
SEQ: Schema = {"type": "string", "pattern": "^[0-9]{1,18}$"}
INTEGER: Schema = {"type": "integer"}
ID: Schema = {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH}
AUTH_HASH: Schema = {
    "type": "string", "minLength": 1, "maxLength": MAX_CREDENTIAL_LENGTH,
    "description": "the client's static hash (SELIS), where the broker accepts those",
}  # fmt: skip
SINCE: Schema = {
    "oneOf": [
        {"type": "integer", "minimum": 0, "maximum": LATEST_SINCE_MS, "description": "ms since the epoch"},
        {"type": "string", "format": "date-time", "description": "an RFC 3339 time with its offset"},
    ],
    "description": "first deliver what it matches of the publications retained (--retention) that were logged "
    "since then, in publication order; 400 when the broker keeps none or it is further back than it keeps, "
    "413 past --max-replay log entries, 429 while a replay of the client's is not yet matched",
}

SCHEMAS: dict[str, Schema] = {
    "Error": _object(
        {
            "error": {"type": "string", "description": "what is wrong, for a person"},
            "field": {"type": "string", "description": "the request field, header or line at fault ('' for none)"},
            "status": INTEGER,
        },
        ("error", "field", "status"),
    ),
    "Constraint": _object(
        {
            "key": {"type": "string", "minLength": 1, "description": "attribute; nested keys are dotted paths"},
            "op": {"type": "string", "enum": sorted(set(OPERATORS)), "default": "eq"},
            "val": {"description": "a scalar; [low, high] for between; an array for in; '*' with eq: any value"},
            "value": {"description": "the same as val"},
            "type": {"type": "string", "description": "int, float, boolean or string (inferred when missing)"},
        },
        ("key",),
        closed=False,
    ),
    "Constraints": {"type": "array", "items": _ref("Constraint"), "maxItems": DEFAULT.constraints},
    "TopK": {
        **_object(
            {
                "k": {"type": "integer", "minimum": 1, "maximum": DEFAULT.k},
                "w": {"type": "number", "minimum": 1, "maximum": DEFAULT.window_ms, "description": "window, ms"},
                "n": {
                    "type": "integer", "minimum": 1, "maximum": DEFAULT.window_count,
                    "description": "window, the last n matching publications (instead of w)",
                },
                "score": {
                    "type": "array", "minItems": 1, "maxItems": DEFAULT.constraints,
                    "items": _object(
                        {
                            "key": {"type": "string", "minLength": 1},
                            "weight": {"type": "number", "exclusiveMinimum": 0},
                            "target": {"type": "number"},
                            "prefer": {"type": "string", "enum": ["high", "low"]},
                        },
                        ("key",),
                        closed=False,
                    ),
                },
            },
            ("k", "score"),
            closed=False,
        ),
        "oneOf": [{"required": ["w"]}, {"required": ["n"]}],  # a window by time or by count, not both
    },
    "SubscribeRequest": _object(
        {
            "authHash": AUTH_HASH,
            "subscriptionId": {**ID, "description": "to replace a subscription of yours; new when missing"},
            "data": _ref("Constraints"),
            "topk": _ref("TopK"),
            "scope": {**ID, "description": "the scope the subscription is made in (members only)"},
            "since": SINCE,
            "limits": _ref("QueueLimits"),
            "webhook": _ref("Webhook"),
        },
        ("data",),
        closed=False,
    ),
    "Webhook": {
        **_object(
            {
                "url": {"type": "string", "maxLength": MAX_URL_LENGTH, "description": "https only"},
                "batch": {
                    "type": "integer", "minimum": 1, "maximum": MOST_BATCHED, "default": 1,
                    "description": "most deliveries in one request",
                },
            },
            ("url",),
        ),
        "description": "deliver by POSTs to this endpoint instead of a connection: in order, signed with the "
        "subscription's secret (Veil-Signature), retried, dead-lettered after the broker's --webhook-attempts; "
        "a public address, or in the broker's --webhook-allow",
    },
    "WebhookSubscribed": _object(
        {
            "subscriptionId": STRING,
            "webhookSecret": {"type": "string", "description": "signs its deliveries; shown this once"},
        },
        ("subscriptionId", "webhookSecret"),
    ),
    "Where": _object(
        {
            "host": STRING, "port": INTEGER, "ws-port": INTEGER, "wsport": INTEGER,
            "subscriptionId": STRING, "announcementId": STRING,
        },
        ("host", "port", "ws-port"),
    ),
    "OwnSubscription": _object(
        {
            "subscriptionId": STRING,
            "data": {"type": "array", "items": _ref("Constraint")},
            "scope": STRING,
            "topk": _ref("TopK"),
            "since": {"type": "integer", "description": "the moment its replay started from, ms since the epoch"},
            "created": {"type": "string", "description": "the log offset of the subscribe that made it"},
        },
        ("subscriptionId", "data", "created"),
    ),
    "QueueLimits": {
        **_object(
            {
                "deliveries": {"type": "integer", "minimum": 1, "description": "most deliveries queued"},
                "bytes": {"type": "integer", "minimum": 1, "description": "most bytes of their publications"},
                "age": {"type": "integer", "minimum": 1, "description": "most ms since a queued one was published"},
            }
        ),
        "description": "the most the subscription's queue holds, each at most the broker's --max-queued-*: the "
        "oldest deliveries past a bound go to its dead letters",
    },
    "DeadLetter": _object(
        {
            "seq": INTEGER, "id": STRING, "publisher": STRING, "keyId": STRING, "signature": STRING,
            "cropped": {"type": "boolean"},
            "reason": {
                "type": "string", "enum": list(DEAD_LETTER_REASONS),
                "description": "the bound of its queue it was past, or attempts: its webhook endpoint never took it",
            },
            "at": {"type": "integer", "description": "when it left the queue, ms since the epoch"},
            "logged": {"type": "integer", "description": "when its publication was logged, ms since the epoch"},
            "publication": {"description": "what would have been delivered"},
        },
        ("seq", "id", "reason", "at", "logged", "publication"),
    ),
    "DeadLetters": _object(
        {
            "deadLetters": {"type": "array", "items": _ref("DeadLetter")},
            "next": {"type": ["integer", "null"], "description": "the `after` of the next page; null on the last"},
        },
        ("deadLetters", "next"),
    ),
    "OwnSubscriptions": _object(
        {
            "subscriptions": {"type": "array", "items": _ref("OwnSubscription")},
            "next": {"type": ["string", "null"], "description": "the `after` of the next page; null on the last"},
        },
        ("subscriptions", "next"),
    ),
    "UnsubscribeRequest": _object({"authHash": AUTH_HASH, "subscriptionId": ID}, ("subscriptionId",), closed=False),
    "AnnounceRequest": _object(
        {"authHash": AUTH_HASH, "announcementId": ID, "data": _ref("Constraints")}, ("data",), closed=False
    ),
    "RevokeRequest": _object({"authHash": AUTH_HASH, "announcementId": ID}, ("announcementId",), closed=False),
    "UnpublishRequest": _object(
        {"authHash": AUTH_HASH, "id": {"type": ["string", "integer"], "description": "what /publish returned"}},
        ("id",),
        closed=False,
    ),
    "Publication": {
        "description": "a JSON object (kept byte for byte), an array of {key, val, type?} pairs, or "
        '{"publication": [{key, val, type?}, ...]}; `veil:scope` and `veil:sealed` are reserved members',
        "type": ["object", "array"],
    },
    "Published": {
        "oneOf": [_object({"id": STRING}, ("id",)), _object({"ids": {"type": "array", "items": STRING}}, ("ids",))]
    },
    "Health": _object(
        {
            "status": {"type": "string", "enum": ["ok", "degraded"]},
            "problems": {"type": "array", "items": STRING},
            "pipeline": {"type": "string", "enum": ["starting", "running", "restarting", "stuck"]},
            "head": INTEGER, "processed": INTEGER, "lag": INTEGER, "quarantined": INTEGER,
            "darkPartitions": {"type": "array", "items": INTEGER},
            "connections": INTEGER, "subscriptionsConnected": INTEGER,
        },
        ("status", "problems", "pipeline", "head", "processed", "lag", "quarantined", "darkPartitions",
         "connections", "subscriptionsConnected"),
    ),
    "Registry": {"type": "object", "description": "the registry document (SPEC §6)"},
    "Quarantine": _object(
        {
            "entries": {
                "type": "array",
                "items": _object(
                    {
                        "offset": INTEGER, "kind": STRING, "subscriptionId": {"type": ["string", "null"]},
                        "owner": {"type": ["string", "null"]}, "error": STRING, "time": {"type": "number"},
                        "body": {"type": ["string", "null"]},
                    },
                    ("offset", "kind", "subscriptionId", "owner", "error", "time", "body"),
                ),
            }
        },
        ("entries",),
    ),
    "Dropped": _object({"offset": INTEGER, "dropped": STRING}, ("offset", "dropped")),
    "PublisherRules": _object(
        {"policies": {"type": "array"}, "cropping": {"type": "array"}}, ()
    ),
    "PublisherRulesRead": _object(
        {
            "policies": {"type": "array"}, "cropping": {"type": "array"},
            "admins": {**_object({"policies": {"type": "array"}, "cropping": {"type": "array"}}, ()),
                       "description": "what the admins set on your publications: it holds beside yours"},
        },
        ("policies", "cropping", "admins"),
    ),
    "ScopeMembers": _object(
        {
            "scope": STRING, "version": INTEGER,
            "members": {"type": "object", "additionalProperties": {"type": ["string", "null"]},
                        "description": "each member's recipient key as the registry lists it, base64 (null: none)"},
            "roster": {"anyOf": [_ref("SignedRoster"), {"type": "null"}],
                       "description": "the newest version's roster, as its manager signed it (null: no version)"},
        },
        ("scope", "version", "members", "roster"),
    ),
    "Roster": _object(
        {
            "scope": STRING, "version": INTEGER,
            "members": {"type": "object", "minProperties": 1, "additionalProperties": STRING,
                        "description": "member -> its recipient public key, base64"},
            "envelopes": {"type": "object", "minProperties": 1, "additionalProperties": STRING,
                          "description": "member -> SHA-256 of its envelope, base64"},
        },
        ("scope", "version", "members", "envelopes"),
    ),
    "SignedRoster": _object(
        {"roster": _ref("Roster"), "keyId": STRING, "signature": STRING}, ("roster", "keyId", "signature")
    ),
    "ScopeKeys": _object(
        {
            "roster": _ref("Roster"), "keyId": STRING,
            "signature": {**STRING, "description": "Ed25519, base64, over veil-roster-1\\n and the canonical roster"},
            "envelopes": {"type": "object", "minProperties": 1, "additionalProperties": STRING,
                          "description": "member -> HPKE envelope of the scope key, base64, for every member"},
        },
        ("roster", "keyId", "signature", "envelopes"),
    ),
    "ScopeVersion": _object({"scope": STRING, "version": INTEGER}, ("scope", "version")),
    "ScopeKey": _object(
        {"scope": STRING, "version": INTEGER, "envelope": STRING, "roster": _ref("Roster"), "keyId": STRING,
         "signature": STRING},
        ("scope", "version", "envelope", "roster", "keyId", "signature"),
    ),
}


def _json(schema: Schema, description: str = "") -> Schema:
    return {"description": description or "OK", "content": {JSON: {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Schema]:
    answers: dict[str, Schema] = {}
    for status in statuses:
        answer = _json(_ref("Error"), ERROR_MEANINGS[status])
        if status == 503:
            answer["headers"] = {"Retry-After": {"schema": INTEGER, "description": "seconds"}}
        answers[str(status)] = answer
    return answers


def _body(schema: Schema, description: str = "") -> Schema:
    body: Schema = {"required": True, "content": {JSON: {"schema": schema}}}
    if description:
        body["description"] = description
    return body


def _auth_header() -> Schema:
    return {"name": "X-Auth-Hash", "in": "header", "required": False, "schema": AUTH_HASH}


def _version_header(required: bool = False) -> Schema:
    return {
        "name": "X-Registry-Version", "in": "header", "required": required,
        "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
        "description": "the registry version the change was made from, as a read answered it: 409 naming the "
        "newest if another change was stored since",
    }  # fmt: skip


VERSION_ANSWER = {"X-Registry-Version": {"schema": STRING, "description": "the registry version answered with"}}


def _versioned(schema: Schema) -> Schema:
    return {**_json(schema), "headers": VERSION_ANSWER}


def _path(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": schema, "description": description}


def _operation(summary: str, responses: dict[str, Schema], **more: object) -> Schema:
    return {"summary": summary, "responses": responses, **more}


PUBLISH = _operation(
    "Publish one publication, or a batch as NDJSON (one per line, all or none)",
    {"200": _json(_ref("Published"), "durable in the log: its id, or the ids of a batch in order"),
     **_errors(400, 401, 403, 408, 409, 413, 503)},
    parameters=[
        _auth_header(),
        {"name": "X-Signature", "in": "header", "required": False, "schema": STRING,
         "description": "the publisher's signature over the raw body (one publication per request)"},
        {"name": "X-Key-Id", "in": "header", "required": False, "schema": STRING},
        {"name": "X-Valid-For", "in": "header", "required": False,
         "schema": {"type": "string", "pattern": "^[0-9]{1,15}$"},
         "description": f"milliseconds the publications stay valid for later subscriptions "
                        f"(1 to {DEFAULT.validity_ms})"},
        {"name": "Idempotency-Key", "in": "header", "required": False,
         "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY},
         "description": "names what the request publishes (printable characters): repeated with it within "
                        "the idempotency window, it is answered with the first ids and publishes nothing new; "
                        "a batch's line N is keyed KEY#N"},
    ],
    requestBody={
        "required": True,
        "content": {
            JSON: {"schema": _ref("Publication")},
            "application/x-ndjson": {"schema": {"type": "string", "description": "one publication per line"}},
        },
    },
)  # fmt: skip

PATHS: dict[str, Schema] = {
    "/publish": {"post": PUBLISH},
    "/unpublish": {
        "post": _operation(
            "Withdraw a still-valid publication of yours from later subscriptions",
            {"200": _json(_object({"id": STRING}, ("id",))), **_errors(*BODY_ERRORS, 404)},
            requestBody=_body(_ref("UnpublishRequest")),
        )
    },
    "/subscribe": {
        "post": _operation(
            "Subscribe (or replace a subscription of yours); deliveries come on the TCP or WebSocket port, or "
            "to its webhook",
            {
                "200": _json(
                    {"oneOf": [_ref("Where"), _ref("WebhookSubscribed")]},
                    "where the subscription's deliveries are served, or its webhook's secret",
                ),
                **_errors(*BODY_ERRORS, 429),
            },
            requestBody=_body(_ref("SubscribeRequest")),
        )
    },
    "/unsubscribe": {
        "post": _operation(
            "Remove a subscription of yours and its queue",
            {"200": _json(_object({"subscriptionId": STRING}, ("subscriptionId",))), **_errors(*BODY_ERRORS, 404)},
            requestBody=_body(_ref("UnsubscribeRequest")),
        )
    },
    "/subscriptions": {
        "get": _operation(
            "Your live subscriptions, in id order, a page at a time",
            {"200": _json(_ref("OwnSubscriptions")), **_errors(400, 401, 403, 503)},
            parameters=[
                _auth_header(),
                {"name": "after", "in": "query", "required": False, "schema": STRING,
                 "description": "list the ids after this one (the previous page's next)"},
                {"name": "limit", "in": "query", "required": False,
                 "schema": {"type": "string", "pattern": "^[0-9]{1,5}$"},
                 "description": "subscriptions per page, 1 to 10000 (default 1000)"},
            ],
        )
    },
    "/subscriptions/{id}": {
        "get": _operation(
            "One of your live subscriptions (404 for an id you hold no live subscription of)",
            {"200": _json(_ref("OwnSubscription")), **_errors(400, 401, 403, 404, 503)},
            parameters=[_auth_header(), _path("id", STRING, "the subscription id")],
        )
    },
    "/subscriptions/{id}/dead-letters": {
        "get": _operation(
            "What left a subscription's queue past its bounds, oldest first, a page at a time (its owner, or an "
            "admin; 404 for anyone else)",
            {"200": _json(_ref("DeadLetters")), **_errors(400, 401, 403, 404, 503)},
            parameters=[
                _auth_header(), _path("id", STRING, "the subscription id"),
                {"name": "after", "in": "query", "required": False, "schema": SEQ,
                 "description": "list the dead letters after this seq (the previous page's next)"},
                {"name": "limit", "in": "query", "required": False,
                 "schema": {"type": "string", "pattern": "^[0-9]{1,4}$"},
                 "description": "dead letters per page, 1 to 1000 (default 100); a page ends before 1 MiB"},
            ],
        ),
        "delete": _operation(
            "Drop a subscription's dead letters (its owner, or an admin)",
            {"200": _json(_object({"purged": INTEGER}, ("purged",))), **_errors(400, 401, 403, 404, 503)},
            parameters=[
                _auth_header(), _path("id", STRING, "the subscription id"),
                {"name": "upto", "in": "query", "required": False, "schema": SEQ,
                 "description": "only those up to this seq (default: all)"},
            ],
        ),
    },
    "/subscriptions/{id}/dead-letters/replay": {
        "post": _operation(
            "Queue a subscription's dead letters again, in their order, after what it has queued (its owner, or "
            "an admin); each still only if its subscriber may receive it under the registry in force",
            {
                "200": _json(
                    _object({"replayed": INTEGER, "left": INTEGER}, ("replayed", "left")),
                    "how many were queued again (at most 10,000 a request), and how many of those asked for are left",
                ),
                **_errors(*BODY_ERRORS, 404),
            },
            parameters=[_auth_header(), _path("id", STRING, "the subscription id")],
            requestBody={
                "required": False,
                "content": {JSON: {"schema": _object(
                    {"upto": {"type": "integer", "minimum": 0, "description": "only those up to this seq"}}, (),
                    closed=False,
                )}},
            },
        )
    },
    "/announce": {
        "post": _operation(
            "An edge broker announces what its publishers can produce (covered by a filter of the registry's "
            "announce section for the caller or for anyone)",
            {"200": _json(_ref("Where")), **_errors(*BODY_ERRORS)},
            requestBody=_body(_ref("AnnounceRequest")),
        )
    },
    "/revoke": {
        "post": _operation(
            "An edge broker withdraws an announcement of its own",
            {"200": _json(_object({"announcementId": STRING}, ("announcementId",))), **_errors(*BODY_ERRORS, 404)},
            requestBody=_body(_ref("RevokeRequest")),
        )
    },
    "/admin/registry": {
        "get": _operation(
            "The registry in force (administrators)",
            {"200": _versioned(_ref("Registry")), **_errors(400, 401, 403, 503)},
            parameters=[_auth_header()],
        ),
        "put": _operation(
            "Replace the registry: a new version in the log (administrators); the last admin stays (409)",
            {"200": _versioned(_ref("Registry")), **_errors(*BODY_ERRORS, 409, 428)},
            parameters=[_auth_header(), _version_header(required=True)],
            requestBody=_body(_ref("Registry")),
        ),
    },
    "/admin/quarantine": {
        "get": _operation(
            "The log entries the pipeline set aside (administrators)",
            {"200": _json(_ref("Quarantine")), **_errors(400, 401, 403)},
            parameters=[_auth_header()],
        )
    },
    "/admin/quarantine/{offset}": {
        "delete": _operation(
            "Drop a quarantined entry (a subscription goes with it) (administrators)",
            {"200": _json(_ref("Dropped")), **_errors(400, 401, 403, 404, 503)},
            parameters=[_auth_header(), _path("offset", STRING, "the offset of the quarantined entry")],
        )
    },
    "/publisher/rules": {
        "get": _operation(
            "The subscription policies and cropping rules of your own publications",
            {"200": _versioned(_ref("PublisherRulesRead")), **_errors(400, 401, 403, 503)},
            parameters=[_auth_header()],
        ),
        "put": _operation(
            "Replace your policies and/or cropping rules (a section left out stays as it is)",
            {"200": _versioned(_ref("PublisherRulesRead")), **_errors(*BODY_ERRORS, 409)},
            parameters=[_auth_header(), _version_header()],
            requestBody=_body(_ref("PublisherRules")),
        ),
    },
    "/scopes/{scope}": {
        "get": _operation(
            "A scope's newest key version and its members' recipient keys (its managers)",
            {"200": _json(_ref("ScopeMembers")), **_errors(400, 401, 404)},
            parameters=[_auth_header(), _path("scope", STRING, "the scope's name")],
        )
    },
    "/scopes/{scope}/keys/{version}": {
        "put": _operation(
            "Store the next key version: a roster signed by the manager storing it, and an envelope for each "
            "member on it (its managers)",
            {"200": _versioned(_ref("ScopeVersion")), **_errors(*BODY_ERRORS, 403, 404, 409)},
            parameters=[
                _auth_header(), _path("scope", STRING, "the scope's name"),
                _path("version", STRING, "the next version"), _version_header(),
            ],
            requestBody=_body(_ref("ScopeKeys")),
        )
    },
    "/scopes/{scope}/key": {
        "get": _operation(
            "The scope key wrapped for you, with the signed roster to verify it by (current members)",
            {"200": _json(_ref("ScopeKey")), **_errors(400, 401, 404)},
            parameters=[
                _auth_header(), _path("scope", STRING, "the scope's name"),
                {"name": "version", "in": "query", "required": False, "schema": STRING,
                 "description": "a key version (the newest when missing)"},
            ],
        )
    },
    "/health": {"get": _operation("The broker's state", {"200": _json(_ref("Health"))})},
    "/ready": {
        "get": _operation(
            "Whether the broker serves its promise: a running pipeline and a store that takes writes",
            {"200": _json(_ref("Health"), "ready"), "503": _json(_ref("Health"), "not ready; `problems` says why")},
        )
    },
    "/metrics": {
        "get": _operation(
            "Figures in Prometheus' exposition format",
            {"200": {"description": "OK", "content": {"text/plain": {"schema": STRING}}}},
        )
    },
    "/dashboard": {
        "get": _operation(
            "A live dashboard over /metrics, for a browser",
            {"200": {"description": "OK", "content": {"text/html": {"schema": STRING}}}},
        )
    },
    "/openapi.json": {"get": _operation("This document", {"200": _json({"type": "object"})})},
}


routes = web.RouteTableDef()


@routes.get("/openapi.json")
async def serve(request: web.Request) -> web.Response:
    return web.Response(body=document(), content_type=JSON)


@cache
def document() -> bytes:
    """The document, serialised once."""
    return orjson.dumps(
        {
            "openapi": "3.1.0",
            "info": {
                "title": "Veil",
                "version": __version__,
                "description": "A privacy-preserving, content-based publish/subscribe broker. Deliveries are "
                "not REST: they come on the TCP and WebSocket ports a subscription's answer names.",
            },
            "paths": PATHS,
            "components": {
                "schemas": SCHEMAS,
                "securitySchemes": {
                    "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
                    "clientCertificate": {"type": "mutualTLS"},
                },
            },
            # or none (an anonymous client, where allowed), or X-Auth-Hash / `authHash` in the body
            "security": [{}, {"bearer": []}, {"clientCertificate": []}],
        }
    )
