"""Whether the Hugging Face Hub can be reached now, asked once before a Hub id (a model, a dataset) is loaded.

Without a network (a GPU machine, a cluster node) transformers retries each file five times
with backoff: a minute and twenty lines of retries before it says what one request could have
said. One request with a short timeout decides instead: out of reach, a Hub id is read from
the local cache alone, at once, or fails at once naming the cache.

Owns that question. Imports huggingface_hub (inside its functions), nothing of models or chess.
"""

from __future__ import annotations

import time

PROBE_TIMEOUT_S = 5.0  # a reachable Hub answers a HEAD well within it; no answer: out of reach
# an endpoint found out of reach is not asked again for this long: a run loads its policy and its reference, a
# match two models, and where connections hang (a firewall that drops them) each ask would wait the timeout again
REMEMBER_S = 60.0
_out_of_reach: dict[str, tuple[float, str]] = {}  # endpoint -> (when it was asked, why it is out of reach)


def out_of_reach(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the Hub cannot be reached now, as a clause for a message (one HEAD to its endpoint, no
    retries, through the proxies huggingface_hub itself uses), or None when it answers (any HTTP
    status) or when offline mode (HF_HUB_OFFLINE) already keeps transformers to the cache. An
    endpoint out of reach is remembered for REMEMBER_S seconds, so the loads after the first wait no more."""
    from huggingface_hub import constants, get_session

    if constants.HF_HUB_OFFLINE:
        return None
    endpoint = constants.ENDPOINT
    asked = _out_of_reach.get(endpoint)
    if asked is not None and time.monotonic() - asked[0] < REMEMBER_S:
        return asked[1]
    try:
        get_session().head(endpoint, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - a transport error of whatever HTTP library the Hub client uses
        why = f"the Hugging Face Hub {endpoint} is out of reach ({type(e).__name__}: {e})"
        _out_of_reach[endpoint] = (time.monotonic(), why)
        return why
    _out_of_reach.pop(endpoint, None)
    return None


def not_asked() -> str | None:
    """Why a Hub id will be read from the local cache alone (offline mode, or the Hub out of reach), or None."""
    from huggingface_hub import constants

    return "offline mode is on (HF_HUB_OFFLINE)" if constants.HF_HUB_OFFLINE else out_of_reach()


def cache_dir() -> str:
    """Where Hub downloads are kept (HF_HUB_CACHE, HF_HOME), for messages."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def cached(repo_id: str) -> bool:
    """Whether the local cache holds a copy of `repo_id` (its config.json at the cached main revision)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
