"""`rookworld sft --rows-cache / --encode-only / --stop-when`: rows encoded once and read back exactly,
and a run handed over from a small data set to a larger one that another process prepared."""

import itertools
import json
import re
from pathlib import Path

import pytest

import rookworld_rlvr.sft_cache as sft_cache
from rookworld_rlvr.chess_tokenizers import build_board_tokenizer
from rookworld_rlvr.data.io import DataError, iter_samples, read_samples, write_samples
from rookworld_rlvr.sft import SFTConfig, train
from rookworld_rlvr.sft_rows import encode
from rookworld_rlvr.sft_cache import training_rows

# a fresh model's `tiny` preset at a small shape here (conftest: small_tiny_preset)
pytestmark = pytest.mark.usefixtures("small_tiny_preset")


DATA = Path(__file__).parents[1] / "data" / "train.jsonl.xz"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """400 shipped samples (P: and A:) as a JSONL file."""
    path = tmp_path_factory.mktemp("cache") / "train.jsonl"
    write_samples(path, itertools.islice(iter_samples(DATA), 400))
    return path


def timed(message: str) -> str:
    """A message without the seconds it ends with (" (12.3 s)"), which must be there."""
    found = re.fullmatch(r"(.*) \(\d+\.\d s\)", message)
    assert found, message
    return found.group(1)


@pytest.mark.parametrize("legal", [False, True])
def test_the_rows_cache_gives_back_exactly_the_encoded_rows_without_encoding(tmp_path, mixed, monkeypatch, legal):
    tok = build_board_tokenizer()
    samples = read_samples(mixed)
    direct = {t: encode(tok, [s for s in samples if s.task == t], "compact", "best-first", legal) for t in "PA"}
    assert direct["P"] and direct["A"] and any(r.bans for r in direct["P"]) and (not legal or direct["P"][0].legal)
    cache = tmp_path / "rows.safetensors"
    said = []
    assert training_rows(mixed, tok, "compact", "best-first", legal, cache, said.append) == direct
    assert cache.exists() and len(said) == 1 and timed(said[0]) == f"sft: 400 rows kept in {cache}"

    def no_encoding(*args, **kwargs):
        raise AssertionError("encoded again")

    monkeypatch.setattr(sft_cache, "encode_many", no_encoding)
    monkeypatch.setattr(sft_cache, "read_samples", no_encoding)
    assert training_rows(mixed, tok, "compact", "best-first", legal, cache, said.append) == direct
    assert timed(said[-1]) == f"sft: 400 rows from the rows cache {cache}"


@pytest.mark.parametrize("legal", [False, True])
def test_encode_only_fills_the_cache_in_workers_with_the_rows_of_one_process(tmp_path, mixed, monkeypatch, legal):
    """--encode-only: workers parse, encode and flatten parts of the file (here 3 workers, 12 parts, each with
    its own mix of P: and A:) and the joined arrays hold exactly the rows that encoding in one process gives."""
    tok = build_board_tokenizer()
    samples = read_samples(mixed)
    direct = {t: encode(tok, [s for s in samples if s.task == t], "compact", "best-first", legal) for t in "PA"}
    cache = tmp_path / "rows.safetensors"
    key = sft_cache.cache_key(mixed, tok, "compact", "best-first", legal)
    assert sft_cache.encode_into(cache, key, mixed, tok, "compact", "best-first", legal, workers=3) == 400
    assert sft_cache.load_rows(cache, key) == direct
    said = []  # through training_rows (no rows come back: nothing is loaded), then read by a run
    assert training_rows(mixed, tok, "compact", "best-first", legal, tmp_path / "c2", said.append, load=False) == {}
    assert len(said) == 1 and timed(said[0]) == f"sft: 400 rows kept in {tmp_path / 'c2'}"
    assert sft_cache.load_rows(tmp_path / "c2", key) == direct
    # a bad line: the error names file:line, and no cache is written
    lines = mixed.read_text().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines[:300] + ['{"task": "P"}\n'] + lines[300:]))
    with pytest.raises(DataError, match=f"^{bad}:301: "):
        sft_cache.encode_into(tmp_path / "c3", key, bad, tok, "compact", "best-first", legal, workers=3)
    assert not (tmp_path / "c3").exists() and not list(tmp_path.glob(".c3*"))


def test_other_data_or_settings_encode_afresh_and_a_damaged_cache_is_named(tmp_path, mixed):
    tok = build_board_tokenizer()
    cache = tmp_path / "rows.safetensors"
    training_rows(mixed, tok, "compact", "best-first", False, cache, lambda s: None)
    lines = mixed.read_text().splitlines(keepends=True)
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(lines[:-1]))  # one sample fewer
    for data, order in ((changed, "best-first"), (changed, "given")):
        said = []
        rows = training_rows(data, tok, "compact", order, False, cache, said.append)
        samples = read_samples(data)
        assert rows == {t: encode(tok, [s for s in samples if s.task == t], "compact", order) for t in "PA"}
        assert said[0] == f"sft: the rows cache {cache} does not hold these rows (other data or settings): " \
            "encoding afresh"
    cache.write_bytes(cache.read_bytes()[:1000])  # cut short
    with pytest.raises(ValueError, match=rf"sft.rows_cache: {cache}: not a readable rows cache .*delete it"):
        training_rows(changed, tok, "compact", "given", False, cache, lambda s: None)


def log(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_encode_only_prepares_the_rows_a_run_then_trains_on_exactly(tmp_path, mixed, monkeypatch):
    common = dict(data=str(mixed), eval_data="", steps=3, batch_size=6, own_repeats=0, lr=1e-3, warmup_steps=1,
                  save_every=100, device="cpu", threads=1)
    with pytest.raises(ValueError, match="sft.encode_only fills a rows cache: give --rows-cache FILE"):
        SFTConfig(**common, encode_only=True).validate()
    cache = tmp_path / "rows.safetensors"
    assert train(SFTConfig(**common, out=str(tmp_path / "prep"), rows_cache=str(cache), encode_only=True),
                 progress=False) == {}
    assert cache.exists() and not (tmp_path / "prep").exists() and not (tmp_path / "prep.sft_log.jsonl").exists()
    train(SFTConfig(**common, out=str(tmp_path / "plain")), progress=False)
    monkeypatch.setattr(sft_cache, "encode_many", lambda *a, **k: pytest.fail("encoded again"))
    train(SFTConfig(**common, out=str(tmp_path / "cached"), rows_cache=str(cache)), progress=False)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("minutes", "seconds")} for r in rows]  # noqa: E731
    assert strip(log(tmp_path / "cached.sft_log.jsonl")) == strip(log(tmp_path / "plain.sft_log.jsonl"))


@pytest.mark.slow
def test_stop_when_hands_the_run_over_to_a_resume_on_more_data(tmp_path, mixed, monkeypatch, capsys):
    """--stop-when FILE ends the invocation, checkpointed, at the step where FILE appears; --resume goes on with
    the same schedule, on the same data exactly as one straight run, or on the larger data another process made."""
    import rookworld_rlvr.sft as sft

    ready = tmp_path / "ready"
    real, steps = sft._accumulate, []

    def ready_after_two_steps(*args, **kwargs):
        steps.append(1)
        if len(steps) == 2:
            ready.touch()
        return real(*args, **kwargs)

    def run(name, resume=False, **kw):
        cfg = dict(data=str(mixed), eval_data="", out=str(tmp_path / name), steps=5, batch_size=6, own_repeats=0,
                   lr=1e-3, warmup_steps=1, save_every=100, device="cpu", threads=1)
        train(SFTConfig(**{**cfg, **kw}), resume=resume, progress=False)
        return [(r["step"], r["lr"], r["loss"]) for r in log(tmp_path / f"{name}.sft_log.jsonl")]

    straight = run("straight")
    monkeypatch.setattr(sft, "_accumulate", ready_after_two_steps)
    assert [s for s, _, _ in run("split", stop_when=str(ready))] == [1, 2]
    assert "paused, --resume continues to step 5" in capsys.readouterr().out
    monkeypatch.setattr(sft, "_accumulate", real)
    assert run("split", resume=True, stop_when=str(ready)) == straight[:2]  # FILE there: stops before a step
    assert run("split", resume=True) == straight
    assert "in the checkpoint" not in capsys.readouterr().out  # where it stops changes nothing computed

    more = tmp_path / "more.jsonl"
    write_samples(more, itertools.islice(iter_samples(DATA), 1200))
    ready.unlink()
    steps.clear()
    monkeypatch.setattr(sft, "_accumulate", ready_after_two_steps)
    run("grown", stop_when=str(ready))
    monkeypatch.setattr(sft, "_accumulate", real)
    grown = run("grown", resume=True, data=str(more))
    assert [s for s, _, _ in grown] == [1, 2, 3, 4, 5] and grown[:2] == straight[:2] and grown[2:] != straight[2:]
    assert f"sft: data was {str(mixed)!r} in the checkpoint, now {str(more)!r} (from this step on)" in capsys.readouterr().out


def test_reading_the_cache_leaves_the_garbage_collector_as_it_was(tmp_path, mixed, monkeypatch):
    """load_rows pauses Python's cyclic collector while it makes the rows (35 s -> 7.5 s for 1.4M) and gives it back
    as it found it, on an error too."""
    import gc

    tok = build_board_tokenizer()
    cache = tmp_path / "rows.safetensors"
    training_rows(mixed, tok, "compact", "best-first", False, cache, lambda s: None)
    key = sft_cache.cache_key(mixed, tok, "compact", "best-first", False)
    assert gc.isenabled() and sft_cache.load_rows(cache, key)["P"] and gc.isenabled()
    gc.disable()
    try:
        assert sft_cache.load_rows(cache, key)["A"] and not gc.isenabled()
    finally:
        gc.enable()
    def damaged(arrays, task):  # a file whose arrays lack a task's
        raise KeyError(task)

    monkeypatch.setattr(sft_cache, "_rows", damaged)
    with pytest.raises(ValueError, match="not a readable rows cache"):
        sft_cache.load_rows(cache, key)
    assert gc.isenabled()
