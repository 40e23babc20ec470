"""The report page's markup helpers: escaping, numbers as the page shows them, the stylesheet.

Owns the look of the page. Pure Python: imports no torch and no chess.
"""

from __future__ import annotations

import html
from typing import Any

from rookworld_rlvr.tables import fmt_number


def esc(text: Any) -> str:
    """Text escaped for HTML (attributes included)."""
    return html.escape(str(text), quote=True)


def html_page(title: str, body: str) -> str:
    """A whole page: `title` as its title and heading, then `body` (sections), in the stylesheet below."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>"
            f"<body><main><h1>{esc(title)}</h1>{body}</main></body></html>\n")


def fmt(v: Any) -> str:
    """A number as the page shows it (the one number format; an en dash where there is none)."""
    return fmt_number(v, missing="–")


CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       margin: 0; background: #f6f8fa; }
main { max-width: 1240px; margin: 0 auto; padding: 20px 28px 48px; background: #fff; }
h1 { font-size: 24px; margin: 8px 0 4px; } h2 { font-size: 19px; margin: 32px 0 10px;
  border-bottom: 1px solid #d0d7de; padding-bottom: 4px; } h3 { font-size: 15px; margin: 22px 0 8px; }
code, pre { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 9px; text-align: left; vertical-align: top; }
thead th { background: #f0f3f6; } tbody tr:nth-child(even) { background: #fafbfc; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th.run { text-align: center; }
table.config td code { white-space: pre-wrap; word-break: break-word; }
table.config td:last-child { max-width: 640px; }
tr.differs td { background: #fff8c5; }
.good { color: #1a7f37; font-weight: 600; } .bad { color: #cf222e; font-weight: 600; }
.muted { color: #656d76; } .small { font-size: 12px; }
details > summary { cursor: pointer; list-style: revert; } h2.fold { display: inline-block; border: 0; }
table.verdict { font-size: 14px; } table.verdict td.good, table.verdict td.bad { font-size: 14px; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 16px;
          align-items: start; }
figure { margin: 0; border: 1px solid #d0d7de; border-radius: 6px; padding: 6px; background: #fff; }
figure img { width: 100%; height: auto; display: block; }
.sample { display: flex; gap: 18px; border: 1px solid #d0d7de; border-radius: 6px; padding: 12px;
          margin: 10px 0; align-items: flex-start; }
.sample .board { flex: 0 0 240px; } .sample .board svg { display: block; }
.sample .text { flex: 1 1 auto; min-width: 0; }
.caption { font-size: 12px; color: #656d76; margin-top: 4px; }
.label { font-size: 11px; text-transform: uppercase; letter-spacing: .04em; color: #656d76; margin-top: 6px; }
pre { margin: 2px 0; padding: 6px 8px; background: #f6f8fa; border-radius: 4px;
      white-space: pre-wrap; word-break: break-all; }
pre.completion { background: #eef4ff; }
.reward { margin-top: 8px; }
.comps { display: flex; flex-wrap: wrap; gap: 6px; margin-top: 6px; }
.comp { font-size: 12px; background: #f0f3f6; border-radius: 10px; padding: 1px 9px; }
"""
