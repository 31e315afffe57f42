"""Landing-zone sources: a folder that receives whole files, each loaded exactly once into
an append-only bronze table.

Example:
    .. code-block:: yaml

        - name: invoices_bronze
          source:
            format: json
            path: ./landing/invoices
            schema: "InvoiceNumber STRING, CreatedTime BIGINT, StoreID STRING"
            landing: {settle: 30s, quarantine: ./landing/invoices/_quarantine}
          strategy: append
          partitioning: {granularity: daily, start: 2026-01-01}
"""

from __future__ import annotations

import os
import posixpath
from datetime import timedelta
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from incremental_assets.specs.durations import parse_duration

SOURCE_FILE = "_ia_source_file"
"""The path of the file a bronze row came from."""
FILE_VERSION = "_ia_file_version"
"""Which content of that file: ``<size>-<modification time in ns>``."""
FILE_ROW = "_ia_file_row"
"""The row's position in its file (1-based)."""
INGESTED_AT = "_ia_ingested_at"
"""When the run that loaded the row started: the bronze table's partition column."""
FILE_KEYS = (SOURCE_FILE, FILE_VERSION, FILE_ROW)

Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


OBJECT_STORE_SCHEMES = ("s3://", "s3a://", "gs://", "gcs://", "az://", "abfs://", "abfss://")
"""URI prefixes of folders on object stores (opened by delta-rs with the storage options)."""


def quarantine_folder(source_path: str, landing: LandingSpec) -> str:
    """Where a landing folder's malformed files go: ``landing.quarantine`` resolved against
    the landing folder (an absolute local path stands as given), else ``_quarantine``
    inside it."""
    if landing.quarantine is None:
        return f"{source_path.rstrip('/')}/_quarantine"
    if source_path.startswith(OBJECT_STORE_SCHEMES):  # a folder inside it (checked by the spec)
        return f"{source_path.rstrip('/')}/{posixpath.normpath(landing.quarantine)}"
    return os.path.join(source_path, landing.quarantine)  # absolute paths win in join


class LandingSpec(BaseModel):
    """How files arrive in a landing folder and where malformed ones go."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    settle: Duration = Field(
        default=timedelta(seconds=30),
        description="A file is read only once its modification time is at least this old "
        "(a writer still appending keeps touching it).",
    )
    marker: str | None = Field(
        default=None,
        description="Suffix of a marker file, e.g. '.done': a file is read only once "
        "'<file><marker>' exists. Marker files themselves are never loaded.",
    )
    quarantine: str | None = Field(
        default=None,
        description="Folder malformed files are moved to, with a '<file>.reason.txt' beside "
        "each; default '<path>/_quarantine'. A relative path resolves against source.path.",
    )
    pattern: str | None = Field(
        default=None,
        description="Only names matching this glob, e.g. '*.json' (default: every file not "
        "starting with '.' or '_').",
    )

    refine: str | None = Field(
        default=None,
        description="Removed: the invoices' silver and gold are declared layers now "
        "(the tables file's 'layers'); a value fails at load saying so.",
    )

    @field_validator("refine")
    @classmethod
    def _refine_removed(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError(
                f"refine: {value} was replaced by declared layers: remove it and declare the "
                "silver and gold under 'layers' (docs/layers.md shows the invoices' silver "
                "and gold; the project's tables.yaml has them)"
            )
        return value

    @field_validator("marker")
    @classmethod
    def _suffix(cls, value: str | None) -> str | None:
        if value is not None and (not value or "/" in value):
            raise ValueError(f"{value!r}: a marker is a file-name suffix such as '.done'")
        return value
