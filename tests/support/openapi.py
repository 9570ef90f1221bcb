"""OpenAPI validators of the gateway's answers, from its own /openapi.json."""

from __future__ import annotations

import jsonschema

from houchu.api.openapi import EVENT_DATA, openapi_document

DOC = openapi_document()


def validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator of ``components/schemas/name`` (its refs resolved in the document)."""
    root = {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
    return jsonschema.Draft202012Validator(root)


def event_validator(path: str) -> jsonschema.Draft202012Validator:
    """A validator of one event's data, as the document's stream media type names it."""
    media = DOC["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
    return jsonschema.Draft202012Validator({**media[EVENT_DATA], "components": DOC["components"]})
