"""Identifier patterns: every name that can reach a file name, a shell script, YAML or Markdown.

Ids from catalogs, scenarios and plan.json become folder names (``POOL_ID/launch-vllm.sh``), shell words
(``--served-model-name``), Kubernetes labels and Markdown table cells. Each kind matches one strict pattern
at the input layer, so nothing later has to guess whether a value is safe: letters, digits and ``. _ -``
only, starting with a letter or digit (never ``.`` or ``..``, never a slash, a quote, a ``$``, a space or
a control character), at most 64 characters. Hugging Face checkpoint ids are ``org/name`` with the same
alphabet on each side (the hub's own rule; every id of the bundled catalogs and of
``shared/reference/checkpoints.md`` matches). Display names are one line of letters, digits, spaces and
a little punctuation.

Export still quotes every shell word with :func:`shlex.quote` and writes YAML with the YAML library: the
patterns are the first wall, not the only one.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

CATALOG_ID = r"^[a-z0-9][a-z0-9._-]{0,63}$"
"""Model, hardware, scenario ids (lower case: they also name Kubernetes objects)."""
ENGINE_ID = r"^[a-z0-9][a-z0-9-]{0,63}$"
NAME_ID = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
"""Workload names."""
POOL_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
"""Pool ids of a plan (``chat-decode-1``): a folder name of the export."""
FILE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.(json|yaml|csv|png|md)$"
"""A file name beside plan.json (an expert placement map): no folder part."""
HF_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
"""A Hugging Face repository id, ``org/name``."""
LABEL = r"^[A-Za-z0-9][A-Za-z0-9 .,:()+/_'-]{0,199}$"
"""A display name (``NVIDIA H200 SXM 141GB (HGX 8-GPU node)``): one line of letters, digits, spaces and
``. , : ( ) + / _ - '`` (an apostrophe); no double quote, ``$``, ``;``, ``&``, backtick, pipe or control character."""

CatalogId = Annotated[str, Field(pattern=CATALOG_ID)]
EngineId = Annotated[str, Field(pattern=ENGINE_ID)]
NameId = Annotated[str, Field(pattern=NAME_ID)]
PoolId = Annotated[str, Field(pattern=POOL_ID)]
FileName = Annotated[str, Field(pattern=FILE_NAME)]
HfId = Annotated[str, Field(pattern=HF_ID)]
Label = Annotated[str, Field(pattern=LABEL)]
