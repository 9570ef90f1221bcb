"""docs/options.md is generated from the flag table: the committed page must be what
``houchu.options.docs.render()`` writes now, so a flag added, renamed or re-documented
without regenerating the page fails here."""

from __future__ import annotations

from houchu.options import docs


def test_options_page_matches_the_flag_table() -> None:
    committed = docs.OPTIONS_DOC_PATH.read_text(encoding="utf-8")
    assert committed == docs.render(), (
        f"{docs.OPTIONS_DOC_PATH} is out of date with options/flags.py: "
        f"run `.venv/bin/{docs.OPTIONS_REGENERATE}` and commit the page"
    )


def test_every_flag_is_on_the_page() -> None:
    from houchu.options.flags import GROUPS

    page = docs.render()
    for group in GROUPS:
        for flag in group.flags:
            assert f"`{flag.name}`" in page
