"""Initial schema: requests, events, steps, lever samples, ledger totals, counters,
benchmark runs.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True)


def upgrade() -> None:
    op.create_table(
        "requests",
        sa.Column("rid", sa.String(128), primary_key=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        *(
            sa.Column(name, sa.Float(), nullable=True)
            for name in (
                "arrived_at",
                "tokenized_at",
                "queued_at",
                "scheduled_at",
                "first_token_at",
                "finished_at",
            )
        ),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("num_preemptions", sa.Integer(), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=True),
        sa.Column("tpot_s", sa.Float(), nullable=True),
        sa.Column("e2e_s", sa.Float(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("preview", sa.String(200), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_requests_started_at", "requests", ["started_at"])

    op.create_table(
        "events",
        _id(),
        sa.Column("rid", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(32), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
    )
    op.create_index("ix_events_rid_t", "events", ["rid", "t"])
    op.create_index("ix_events_t", "events", ["t"])

    op.create_table(
        "steps",
        _id(),
        sa.Column("actor", sa.String(32), nullable=False),
        sa.Column("step_id", sa.Integer(), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("num_prefill_tokens", sa.Integer(), nullable=False),
        sa.Column("num_decode_tokens", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
    )
    op.create_index("ix_steps_t", "steps", ["t"])

    op.create_table(
        "lever_samples",
        _id(),
        sa.Column("lever", sa.String(64), nullable=False),
        sa.Column("verb", sa.String(32), nullable=False),
        sa.Column("saved", sa.Float(), nullable=False),
        sa.Column("saved_unit", sa.String(32), nullable=False),
        sa.Column("spent", sa.Float(), nullable=False),
        sa.Column("spent_unit", sa.String(32), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("rid", sa.String(128), nullable=True),
        sa.Column("actor", sa.String(32), nullable=False),
    )
    op.create_index("ix_lever_samples_rid", "lever_samples", ["rid"])
    op.create_index("ix_lever_samples_t", "lever_samples", ["t"])

    op.create_table(
        "ledger_totals",
        sa.Column("lever", sa.String(64), primary_key=True),
        sa.Column("verb", sa.String(32), primary_key=True),
        sa.Column("saved_unit", sa.String(32), primary_key=True),
        sa.Column("spent_unit", sa.String(32), primary_key=True),
        sa.Column("saved", sa.Float(), nullable=False),
        sa.Column("spent", sa.Float(), nullable=False),
        sa.Column("saved_max", sa.Float(), nullable=False),
        sa.Column("spent_max", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("first_t", sa.Float(), nullable=False),
        sa.Column("last_t", sa.Float(), nullable=False),
    )

    op.create_table(
        "counters",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Float(), nullable=False),
    )

    op.create_table(
        "bench_runs",
        _id(),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("results", sa.JSON(), nullable=False),
    )
    op.create_index("ix_bench_runs_created", "bench_runs", ["created"])


def downgrade() -> None:
    for table in (
        "bench_runs",
        "counters",
        "ledger_totals",
        "lever_samples",
        "steps",
        "events",
        "requests",
    ):
        op.drop_table(table)
