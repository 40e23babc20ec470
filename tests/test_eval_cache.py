"""`eval_cache`: the held-out evaluation of the weights a run starts from keeps its greedy answers, and a later
run from the same weights reads them back instead of decoding them; never for other weights, another thread
count or other decoding code, and a cache that cannot be written or was cut short loses nothing."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rookworld_rlvr.config import load_config
from rookworld_rlvr.grpo import state
from rookworld_rlvr.grpo.cli import build

READ = "batches of answers read from the evaluation cache"


def evaluate(tmp_path: Path, model: Path, data: Path, cache: Path, name: str) -> tuple[dict, list[str]]:
    """One run's base evaluation (its results less their timings) and what it logged about its answers."""
    cfg = load_config(None, {"model": str(model), "data": str(data / "train.jsonl"), "eval_data": str(data / "eval.jsonl"),
                             "eval_limit": 3, "eval_batch_size": 2, "strength_data": None, "puzzle_eval_data": None,
                             "history_eval_data": None, "engine_cache": None, "device": "cpu", "progress": False,
                             "report": False, "tensorboard": False, "output_dir": str(tmp_path / name),
                             "eval_cache": str(cache)})
    logged: list[str] = []
    tr, pool = build(cfg, log=logged.append)
    try:
        res = tr.evaluate()
    finally:
        pool.close()
    return {k: v for k, v in res.items() if k not in ("seconds", "meta")}, [m for m in logged if "held-out" in m or
                                                                            "eval_cache" in m]


def test_a_second_run_reads_the_base_answers_and_nothing_else_does(tmp_path, tiny_model_dir, small_data, one_thread,
                                                                    monkeypatch):
    cache = tmp_path / "cache"
    first, logged = evaluate(tmp_path, tiny_model_dir, small_data, cache, "a")
    assert logged == [] and len(files := list(cache.iterdir())) == 1
    kept = files[0].read_text().splitlines()
    header = json.loads(kept[0])
    assert header["arithmetic"].endswith("1 threads") and header["code"] == state.code_digest()
    assert len(kept) == 1 + 4  # 3 P: and 3 A: prompts, 2 a batch
    again, logged = evaluate(tmp_path, tiny_model_dir, small_data, cache, "b")
    assert again == first and logged == [f"held-out evaluation at step 0: 4 {READ} {files[0]}"]
    # a last line cut short (a kill while another run wrote it: `keep` renames, but a copied cache may be torn) is
    # dropped, and that batch decoded again
    files[0].write_text("\n".join(kept[:-1] + [kept[-1][:20]]))
    again, logged = evaluate(tmp_path, tiny_model_dir, small_data, cache, "c")
    assert again == first and logged == [f"held-out evaluation at step 0: 3 {READ} {files[0]}"]
    assert len(files[0].read_text().splitlines()) == 5  # whole again
    # lines that are not what a run writes (a damaged or edited copy): answers that are a number or hold numbers, or
    # fewer answers than the batch's prompts, ended the run in a TypeError or were scored as they were; each such
    # batch is decoded again, and the results are the first run's
    rows = [json.loads(line) for line in kept[1:]]
    rows[0]["texts"] = 5
    rows[1]["texts"] = [1] * len(rows[1]["reasons"])
    rows[2]["texts"], rows[2]["reasons"] = rows[2]["texts"][:1], rows[2]["reasons"][:1]  # 1 of its batch's 2 prompts
    files[0].write_text("\n".join(kept[:1] + [json.dumps(r) for r in rows]) + "\n")
    again, logged = evaluate(tmp_path, tiny_model_dir, small_data, cache, "f")
    assert again == first and logged == [f"held-out evaluation at step 0: 2 {READ} {files[0]}"]
    # another thread count (another float summation order) or other decoding code: a cache file of their own
    torch.set_num_threads(2)
    _, logged = evaluate(tmp_path, tiny_model_dir, small_data, cache, "d")
    torch.set_num_threads(1)
    monkeypatch.setattr(state, "code_digest", lambda: "changed")
    _, more = evaluate(tmp_path, tiny_model_dir, small_data, cache, "e")
    assert logged == more == [] and len(list(cache.iterdir())) == 3


def test_other_weights_read_nothing_and_a_cache_that_cannot_be_written_loses_nothing(tmp_path, tiny_model_dir,
                                                                                   small_data, one_thread):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookworld_rlvr.model import save_pretrained_atomic

    cache = tmp_path / "cache"
    first, _ = evaluate(tmp_path, tiny_model_dir, small_data, cache, "a")
    files = list(cache.iterdir())
    torch.manual_seed(3)
    other = AutoModelForCausalLM.from_config(AutoModelForCausalLM.from_pretrained(tiny_model_dir).config)
    save_pretrained_atomic(other, AutoTokenizer.from_pretrained(tiny_model_dir), tmp_path / "other")
    _, logged = evaluate(tmp_path, tmp_path / "other", small_data, cache, "b")
    assert logged == [] and len(list(cache.iterdir())) == 2
    # a cache file the machine cannot read or replace (here a folder in its place): the evaluation stands, and the
    # run says what it lost
    (blocked := tmp_path / "blocked" / files[0].name).mkdir(parents=True)
    res, logged = evaluate(tmp_path, tiny_model_dir, small_data, blocked.parent, "c")
    assert res == first and len(logged) == 2 and blocked.is_dir() and list(blocked.parent.iterdir()) == [blocked]
    assert logged[0].startswith(f"warning: eval_cache: cannot read {blocked} (") and \
        logged[0].endswith("its answers are decoded again")
    assert logged[1].startswith("warning: eval_cache: the answers were not kept (") and \
        logged[1].endswith("the next run decodes them again")
