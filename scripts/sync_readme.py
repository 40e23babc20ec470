"""Regenerate the README's configuration table from the dataclass (python scripts/sync_readme.py)."""

import re
from pathlib import Path

from rookworld_rlvr.config import help_table

readme = Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text()
new = re.sub(r"<!-- config-table -->.*?<!-- /config-table -->",
             lambda m: f"<!-- config-table -->\n{help_table()}\n<!-- /config-table -->", text, flags=re.S)
readme.write_text(new)
print("README config table updated" if new != text else "README config table already up to date")
