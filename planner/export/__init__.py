"""Export layer: summaries and human-readable text for the CLI and for files."""

from __future__ import annotations
