"""Write ``planner/perf/mdc_table.py``: the exact M/D/c waiting ratios the percentile formulas interpolate
(``planner.perf.waits.md_c_ratios``; ~10 s). Run after changing ``MDC_SERVERS``, ``MDC_LOGIT`` or ``md_c_wait``.

    python bench/mdc_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.perf.waits import md_c_table_source  # noqa: E402

if __name__ == "__main__":
    out = ROOT / "planner" / "perf" / "mdc_table.py"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(md_c_table_source())
    tmp.replace(out)
    print(f"wrote {out}")
