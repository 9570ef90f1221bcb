"""docs/api-parameters.md is generated from the request types of
``houchu.api.schema.bodies``: the committed page must be what
``houchu.api.schema.docs.render()`` writes now, so a request field added or re-bounded
without regenerating the page fails here."""

from __future__ import annotations

import msgspec

from houchu.api.schema import docs


def test_api_parameters_page_matches_the_request_schema() -> None:
    committed = docs.API_PARAMETERS_DOC_PATH.read_text(encoding="utf-8")
    assert committed == docs.render(), (
        f"{docs.API_PARAMETERS_DOC_PATH} is out of date with api/schema/bodies.py: "
        f"run `.venv/bin/{docs.API_PARAMETERS_REGENERATE}` and commit the page"
    )


def test_every_body_field_is_on_the_page() -> None:
    page = docs.render()
    for _, body in docs.BODIES:
        for field in msgspec.structs.fields(body):
            assert f"`{field.encode_name}`" in page, (body.__name__, field.name)
