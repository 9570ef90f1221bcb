"""Lever history in the catalog's names and units (``houchu.storage.lever_names``).

Weight quantization samples recorded per label (``weight_quant_int4-g32``) become the
catalog's ``weight_quant_int4``; samples whose spent amount stood for an unmeasured cost
(always 0, in bytes, tokens or seconds) get spent unit "". ``ledger_totals`` rows whose
key changes are merged into the row of the new key (sums added, maxima and times kept).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from houchu.storage.lever_names import current_lever, current_spent_unit

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    pairs = conn.execute(sa.text("SELECT DISTINCT lever, spent_unit FROM lever_samples")).all()
    for lever, unit in pairs:
        new = (current_lever(lever), current_spent_unit(lever, unit))
        if new != (lever, unit):
            conn.execute(
                sa.text(
                    "UPDATE lever_samples SET lever = :nl, spent_unit = :nu "
                    "WHERE lever = :ol AND spent_unit = :ou"
                ),
                {"nl": new[0], "nu": new[1], "ol": lever, "ou": unit},
            )
    _merge_totals(conn)


def _merge_totals(conn) -> None:
    cols = "lever, verb, saved_unit, spent_unit, saved, spent, saved_max, spent_max, samples, first_t, last_t"
    rows = conn.execute(sa.text(f"SELECT {cols} FROM ledger_totals")).all()
    merged: dict[tuple, list] = {}
    changed = False
    for r in rows:
        key = (current_lever(r[0]), r[1], r[2], current_spent_unit(r[0], r[3]))
        changed |= key != tuple(r[:4])
        m = merged.get(key)
        if m is None:
            merged[key] = list(r[4:])
            continue
        m[0] += r[4]
        m[1] += r[5]
        m[2], m[3] = max(m[2], r[6]), max(m[3], r[7])
        m[4] += r[8]
        m[5], m[6] = min(m[5], r[9]), max(m[6], r[10])
    if not changed:
        return
    conn.execute(sa.text("DELETE FROM ledger_totals"))
    for key, m in merged.items():
        conn.execute(
            sa.text(
                f"INSERT INTO ledger_totals ({cols}) VALUES (:l, :v, :su, :pu, :s, :p, :sm, "
                ":pm, :n, :f, :t)"
            ),
            dict(
                zip(
                    ("l", "v", "su", "pu", "s", "p", "sm", "pm", "n", "f", "t"),
                    (*key, *m),
                    strict=True,
                )
            ),
        )


def downgrade() -> None:
    """Nothing to undo: the old names and units carried no more than the new ones."""
