"""Version 10 of the store: a campaign's generations and the provenance of each output.

A generation is one planning of the campaign (spec and profile as they were); an input and a
submission belong to the generation whose jobs carried them. A provenance row is written when an
output passes QA: what made it, in one JSON record, with its path, size and checksum as columns.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

from sqlalchemy import BigInteger, Column, ForeignKey, Index, Integer, MetaData, String, Table, Text

from hpcrun.store.sql.coltypes import ID, UTCDateTime


def v10_columns() -> Dict[str, Sequence[Column[Any]]]:
    """The generation of each input (of the jobs that hold it) and of each submission; an input
    withdrawn by a later generation (listed no more, never done) keeps its row with the number."""
    return {
        "hpcrun_input": (Column("generation", Integer, nullable=True),      # NULL: 1
                         Column("withdrawn_in", Integer, nullable=True)),
        "hpcrun_submission": (Column("generation", Integer, nullable=True),),  # NULL: 1
    }


def v10_tables(md: MetaData) -> Tuple[Table, ...]:
    """Each generation of a campaign, and each output's provenance record."""
    generation = Table(
        "hpcrun_generation", md,
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), primary_key=True),
        Column("number", Integer, primary_key=True, autoincrement=False),
        Column("spec_digest", String(128), nullable=False),
        Column("profile_digest", String(128), nullable=False),
        Column("reprocess", String(16), nullable=False),          # none | failed | all
        Column("details", Text, nullable=False),                  # JSON: release, image, outputs location ...
        Column("planned_by", String(300), nullable=False),        # user@host:pid
        Column("planned_at", UTCDateTime, nullable=False),
        Column("applied_at", UTCDateTime, nullable=False),        # when the store took it up
    )
    provenance = Table(
        "hpcrun_provenance", md,
        Column("id", ID, primary_key=True),
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), nullable=False),
        Column("input_id", ID, ForeignKey("hpcrun_input.id", ondelete="CASCADE"), nullable=False),
        Column("generation", Integer, nullable=False),
        Column("output_path", Text, nullable=False),
        Column("size", BigInteger, nullable=True),
        Column("checksum", String(160), nullable=True),            # algo:value
        Column("record", Text, nullable=False),                    # the whole record, JSON
        Column("recorded_at", UTCDateTime, nullable=False),
        # the catalogue export reads a page at a time by id: of the campaign, or of one of its generations
        Index(None, "campaign_id", "id"),
        Index(None, "campaign_id", "generation", "id"),
        Index(None, "input_id"),
    )
    return generation, provenance
