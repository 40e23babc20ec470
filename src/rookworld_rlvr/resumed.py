"""What a resume changes: the settings a resumed run is given that differ from those its checkpoint was saved with.

A resume with the same settings continues the run exactly; any other setting takes effect from the resumed step on,
so each one is said (`rookworld train --resume --lr 3e-5`, `rookworld sft --resume --steps 400`).

Owns that comparison, for GRPO (`grpo.trainer`) and SFT (`sft`). Pure Python: imports nothing of the package.
"""

from __future__ import annotations

from typing import Any, Iterable


def changed_settings(saved: dict[str, Any], now: dict[str, Any], defaults: dict[str, Any],
                     place: Iterable[str] = ()) -> list[str]:
    """One line per setting of `now` that differs from `saved`, the checkpoint's. A setting newer than the checkpoint
    had its default's effect there. `place`: settings that change where or how fast the run goes, not what it
    computes (its folder, its threads), never said."""
    skip = set(place)
    was = {k: saved.get(k, defaults.get(k)) for k in now}
    return [f"{k} was {was[k]!r} in the checkpoint{'' if k in saved else ' (its default then)'}, now {now[k]!r} "
            "(from this step on)" for k in now if k not in skip and was[k] != now[k]]
