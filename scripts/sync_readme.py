"""Regenerate the configuration table in docs/configuration.md from the dataclass (python scripts/sync_readme.py)."""

import re
from pathlib import Path

from rookworld_rlvr.config import help_table

readme = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
text = readme.read_text()
new = re.sub(r"<!-- config-table -->.*?<!-- /config-table -->",
             lambda m: f"<!-- config-table -->\n{help_table()}\n<!-- /config-table -->", text, flags=re.S)
readme.write_text(new)
print("docs/configuration.md table updated" if new != text else "docs/configuration.md table already up to date")
