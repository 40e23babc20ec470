"""Supervised bootstrap: trains, saves a loadable model, resumes from its checkpoint."""

import json
import sys

import pytest
import torch

from rookworld_rlvr.cli import main
from rookworld_rlvr.model import load_policy
from rookworld_rlvr.sft import SFTConfig, _accumulate, encode, make_batch, set_dropout, train

from numerics import assert_rounding_close, gradient_terms  # noqa: E402


# a fresh model's `tiny` preset at a small shape here (conftest: small_tiny_preset)
pytestmark = pytest.mark.usefixtures("small_tiny_preset")


def test_completion_only_loss_masks_prompt_and_padding():
    ids, mask, labels = make_batch([([5, 6, 7, 8, 0], 2), ([5, 6, 0], 1)], pad_id=0, loss_on="completion")
    assert labels.tolist() == [[-100, -100, 7, 8, 0], [-100, 6, 0, -100, -100]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]


def test_length_bucketed_micro_batches_give_the_mixed_batch_gradient(tiny_model_dir, small_data):
    """The step is split into a short and a long micro-batch; loss and gradient must not change."""
    import contextlib

    import torch

    from rookworld_rlvr.data.io import read_samples

    model, tok = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    model.train()
    set_dropout(model, 0.0)
    rows = encode(tok, read_samples(small_data / "eval.jsonl"), "compact")[::3]
    assert len({len(ids) for ids, *_ in rows}) > 5  # P: and A: lengths mixed
    for loss_on in ("full", "completion"):
        model.zero_grad()
        ids, mask, labels = make_batch(rows, tok.pad_token_id, loss_on)
        whole = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        whole.backward()
        expected = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        split, _, _ = _accumulate(model, rows, tok.pad_token_id, loss_on, contextlib.nullcontext(), torch.device("cpu")).tolist()
        n = gradient_terms(model, mask)  # the loss and every weight gradient sum over the batch's tokens
        assert_rounding_close(torch.tensor(split), whole.detach(), n, f"{loss_on} loss")
        for (name, p), g in zip(model.named_parameters(), expected, strict=True):
            assert_rounding_close(p.grad, g, n, f"{loss_on} gradient of {name}")


def test_repeat_bans_teach_that_no_move_is_written_twice(tiny_model_dir):
    """The unlikelihood targets: where a later M: move shares all but its last token with an earlier
    one, that earlier move's last token is banned; with distinct_coef the loss pushes it down."""
    import contextlib

    from rookworld_rlvr.chess_tokenizers import build_board_tokenizer, build_chess_tokenizer
    from rookworld_rlvr.sft import repeat_bans

    text = "M: g7h7 g7f7 e2e4 g7g6 E: 1.0 0.5 0.2 0.1 B: g7h7"
    for tok in (build_board_tokenizer(), build_chess_tokenizer()):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        bans = repeat_bans(text, enc["input_ids"], enc["offset_mapping"])
        pieces = tok.convert_ids_to_tokens(enc["input_ids"])
        named = [(text[enc["offset_mapping"][k][0]:enc["offset_mapping"][k][1]], tok.convert_ids_to_tokens(t))
                 for k, t in bans]
        if len(tok) > 98:  # square tokens: g7f7's "f7" must not be "h7"; g7g6's "g6" neither "h7" nor "f7"
            assert named == [("f7", "h7"), ("g6", "h7"), ("g6", "f7")], (pieces, named)
        else:  # characters: the banned char is the last of the earlier move (same first three chars)
            assert named == [], named  # g7h7 / g7f7 differ at the third char, not only the last
    model, tok = load_policy(str(tiny_model_dir), device="cpu", verbose=False)  # a char-tokenizer GPT-2
    text = "M: g7h7 g7h8 E: 1.0 0.5 B: g7h7"  # char model: g7h8 shares "g7h" with g7h7
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert [(k, tok.convert_ids_to_tokens(t)) for k, t in repeat_bans(text, enc["input_ids"], enc["offset_mapping"])] \
        == [(text.index("g7h8") + 3, "7")]
    row = (enc["input_ids"] + [0], 0, tuple(repeat_bans(text, enc["input_ids"], enc["offset_mapping"])))
    _, ul, _ = _accumulate(model, [row], 0, "full", contextlib.nullcontext(), torch.device("cpu"), distinct_coef=1.0).tolist()
    ids = torch.tensor([row[0]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    k, t = row[2][0]
    p = torch.softmax(logits[k - 1], -1)[t]
    assert ul == pytest.approx(float(-torch.log1p(-p)) / (len(row[0]) - 1), rel=1e-4)
    _, none, _ = _accumulate(model, [row], 0, "full", contextlib.nullcontext(), torch.device("cpu"), distinct_coef=0.0).tolist()
    assert none == 0.0


def test_own_repeat_rows_push_down_the_moves_the_model_repeats(reference_lines):
    """The shipped char model writes its top move again and again under greedy decoding: each such
    answer becomes a row of its own prefix, with a ban on the repeat's last token and no likelihood
    target; a step on those rows lowers the repeat's probability."""
    import contextlib

    from rookworld_rlvr.grpo.control import adamw
    from rookworld_rlvr.sft import own_repeat_rows
    from rookworld_rlvr.tasks import policy as P

    from conftest import REPO

    model, tok = load_policy(str(REPO / "models" / "rookworld-board"), device="cpu", verbose=False)
    samples = [__import__("rookworld_rlvr.data.io", fromlist=["Sample"]).Sample("P", P.parse_line(x))
               for x in reference_lines[:8]]
    rows = encode(tok, samples, "compact")
    own = own_repeat_rows(model, tok, rows)
    assert len(own) >= 4  # the repeats this test is about
    for ids, n, ((pos, banned),), *_ in own:
        text = tok.decode(ids)
        moves = text.split("M:")[1].split()
        assert n == -1 and moves[-1] in moves[:-1] and pos == len(ids) - 1 and ids[pos] == banned
    _, mask, labels = make_batch(own, tok.pad_token_id, "full")
    assert (labels == -100).all()  # no likelihood target on the model's own answers

    def repeat_prob() -> float:
        with torch.no_grad():
            return sum(float(torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, pos - 1], -1)[t])
                       for ids, _, ((pos, t),), *_ in own)

    before = repeat_prob()
    model.train()
    opt = adamw(list(model.parameters()), 1e-3, (0.9, 0.95), 0.0)
    for _ in range(3):
        opt.zero_grad()
        _accumulate(model, rows + own, 0, "full", contextlib.nullcontext(), torch.device("cpu"), distinct_coef=2.0)
        opt.step()
    model.eval()
    assert repeat_prob() < 0.5 * before


def test_legal_sets_are_the_legal_continuations_of_each_move_not_yet_listed():
    """At each token of a P: move, the set holds the tokens that continue a legal move from the same
    prefix; in M:, the moves listed before it are no longer allowed. An illegal target ends the sets."""
    from rookworld_rlvr.chess_tokenizers import build_board_tokenizer, build_chess_tokenizer
    from rookworld_rlvr.sft_rows import legal_sets

    start = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    text = "M: e2e4 e2e3 g1f3 E: 0.3 0.2 0.1 B: e2e4"
    tok = build_board_tokenizer()
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    sets = legal_sets(start, text, enc["input_ids"], enc["offset_mapping"], tok)
    named = [(tok.convert_ids_to_tokens(enc["input_ids"][k]), sorted(tok.convert_ids_to_tokens(list(s)))) for k, s in sets]
    froms = sorted([f"{f}2" for f in "abcdefgh"] + ["b1", "g1"])
    assert named == [("e2", froms), ("e4", ["e3", "e4"]),  # e2e4
                     ("e2", froms), ("e3", ["e3"]),  # e2e3: e2e4 is listed already
                     ("g1", [f for f in froms if f != "e2"]), ("f3", ["f3", "h3"]),  # e2's two moves are both listed
                     ("e2", froms), ("e4", ["e3", "e4"])]  # B: names a listed move by design
    chars = build_chess_tokenizer()
    enc = chars(text, add_special_tokens=False, return_offsets_mapping=True)
    sets = legal_sets(start, text, enc["input_ids"], enc["offset_mapping"], chars)
    assert len(sets) == 16 and sorted(chars.convert_ids_to_tokens(list(sets[7][1]))) == ["3"]  # e2e3's last char
    bad = "M: e2e4 e2e5 g1f3 E: 0.3 0.2 0.1 B: e2e4"  # e2e5 is illegal: only e2e4's sets
    enc = tok(bad, add_special_tokens=False, return_offsets_mapping=True)
    assert len(legal_sets(start, bad, enc["input_ids"], enc["offset_mapping"], tok)) == 2


@pytest.mark.slow
def test_legality_loss_is_the_log_mass_off_legal_moves_and_training_on_it_raises_held_out_legality(
        tiny_model_dir, small_data):
    """legality_loss is -log of the probability on the legal set, summed over the sets; a few steps with
    legal_coef put more held-out probability on legal continuations than the same steps without it."""
    import contextlib

    from rookworld_rlvr.data.io import read_samples
    from rookworld_rlvr.grpo.control import adamw
    from rookworld_rlvr.sft_rows import legality_loss

    _, tok = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    train_rows = encode(tok, read_samples(small_data / "train.jsonl"), "compact", legal=True)
    held = encode(tok, [s for s in read_samples(small_data / "eval.jsonl") if s.task == "P"], "compact", legal=True)
    assert all(r.legal for r in held) and not any(r.legal for r in train_rows if not r.moves)  # P: rows only

    def held_out(model) -> float:
        ids, mask, _ = make_batch(held, 0, "full")
        with torch.no_grad():
            return float(legality_loss(model(input_ids=ids, attention_mask=mask).logits, held))

    model, _ = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    r = held[0]
    logp = torch.log_softmax(model(input_ids=torch.tensor([r.ids])).logits[0].detach(), -1)
    by_hand = -sum(float(torch.logsumexp(logp[pos - 1, list(toks)], 0)) for pos, toks in r.legal)
    ids, mask, _ = make_batch([r], 0, "full")
    assert float(legality_loss(model(input_ids=ids, attention_mask=mask).logits.detach(), [r])) == pytest.approx(by_hand, rel=1e-5)
    after = {}
    for coef in (0.0, 50.0):
        model, _ = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
        model.train()
        set_dropout(model, 0.0)  # as SFT trains by default (and CPU attention with dropout is about 4x slower)
        opt = adamw(list(model.parameters()), 1e-2, (0.9, 0.95), 0.0)
        for _ in range(8):
            opt.zero_grad()
            _accumulate(model, train_rows, 0, "full", contextlib.nullcontext(), torch.device("cpu"), legal_coef=coef)
            opt.step()
        model.eval()
        after[coef] = held_out(model)
    assert after[50.0] < 0.75 * after[0.0], after  # measured 0.66
    with pytest.raises(ValueError, match="legal_coef"):
        SFTConfig(data=str(small_data / "train.jsonl"), legal_coef=-1.0).validate()


def test_first_repeat_reads_the_m_list_only():
    from rookworld_rlvr.sft_rows import first_repeat

    text = "M: g2h2 g2g1 g2h2 E: 1.0 0.5 0.2 B: g2h2"
    assert text[slice(*first_repeat(text))] == "g2h2" and first_repeat(text)[0] == text.rindex("g2h2 E")
    assert first_repeat("M: g2h2 E: -999.99 B: g2h2") is None  # B: names an M: move by design
    assert first_repeat("M: a2a3 b2b3 c2c3 d2d3 e2e4") is None and first_repeat("E: 1.0") is None


def test_own_targets_teach_the_best_true_move_not_yet_listed(reference_lines):
    """With own_targets, each repeat also gives a correction row: the model's own prefix before the
    repeated move, then the best true candidate it has not listed (DAgger); only that move is learned,
    at the given weight. A few steps on the rows raise that move's probability where the model repeated."""
    import contextlib

    from rookworld_rlvr.data.io import Sample
    from rookworld_rlvr.grpo.control import adamw
    from rookworld_rlvr.sft_rows import own_repeat_rows, token_weights
    from rookworld_rlvr.tasks import policy as P

    from conftest import REPO

    model, tok = load_policy(str(REPO / "models" / "rookworld-board"), device="cpu", verbose=False)
    samples = [Sample("P", P.parse_line(x)) for x in reference_lines[:8]]
    rows = encode(tok, samples, "compact", "best-first")
    assert own_repeat_rows(model, tok, rows, target_weight=0.0) == [r for r in own_repeat_rows(model, tok, rows, target_weight=3.0)
                                                                      if r.learn_from is None]
    own = own_repeat_rows(model, tok, rows, target_weight=3.0)
    fixes = [r for r in own if r.learn_from is not None]
    assert len(fixes) >= 4
    by_prompt = {tuple(r.ids[: r.prompt_len]): r for r in rows}
    for fix in fixes:
        text = tok.decode(fix.ids)
        source = next(r for p, r in by_prompt.items() if list(p) == fix.ids[: len(p)])
        listed = text[len(tok.decode(source.ids[: source.prompt_len])):].split()[1:-1]
        target = text.split()[-1]
        assert target == next((m for m in source.moves if m not in listed), "E:"), (text, source.moves)
        assert len(set(listed)) == len(listed) and target not in listed
        _, _, labels = make_batch([fix], tok.pad_token_id, "full")
        assert tok.decode([t for t in labels[0].tolist() if t != -100]) == target  # only the move is learned
        assert set(token_weights([fix], labels)[0].tolist()) == {0.0, 3.0}

    def target_logp() -> float:
        with torch.no_grad():
            total = 0.0
            for r in fixes:
                logp = torch.log_softmax(model(input_ids=torch.tensor([r.ids])).logits[0], -1)
                total += sum(float(logp[k - 1, r.ids[k]]) for k in range(r.learn_from, len(r.ids)))
            return total

    before = target_logp()
    model.train()
    opt = adamw(list(model.parameters()), 2e-4, (0.9, 0.95), 0.0)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        losses.append(_accumulate(model, rows + own, 0, "full", contextlib.nullcontext(), torch.device("cpu"),
                                  distinct_coef=2.0)[0].item())
        opt.step()
    model.eval()
    assert target_logp() > before + 10.0 and losses[-1] < losses[0]  # measured -32 -> -9 nats, data loss down
    with pytest.raises(ValueError, match="own_targets"):
        SFTConfig(data=str(REPO / "data" / "train.jsonl.xz"), own_targets=-1.0).validate()


def test_sft_dropout_setting_reaches_modules_and_saved_config(tmp_path, small_data, tiny_model_dir):
    import torch

    out = tmp_path / "m"
    cfg = SFTConfig(data=str(small_data / "train.jsonl"), eval_data=str(small_data / "eval.jsonl"), out=str(out),
                    init=str(tiny_model_dir), steps=1, batch_size=4, eval_samples=0, lr=1e-3, dropout=0.2,
                    device="cpu", threads=1)
    train(cfg, progress=False)
    model, _ = load_policy(str(out), device="cpu", verbose=False)
    assert model.config.attn_pdrop == model.config.resid_pdrop == model.config.embd_pdrop == 0.2
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.2}
    set_dropout(model, 0.0)
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.0}


def test_sft_weight_decay_grad_clip_context_and_layout_do_what_they_say(tmp_path, small_data, tiny_model_dir):
    """weight_decay: one step's weights differ by exactly -lr x decay x w on the matrices and not at all on biases
    and layer norms; grad_clip: a tight clip changes the step, and 0 is no clip (the same as one that never binds);
    n_positions: a fresh model's context, and rows longer than it are an error; layout: the text trained on.
    Values that mean nothing are named before any work."""
    from safetensors.torch import load_file

    from rookworld_rlvr.data.io import read_samples

    def run(name: str, **over) -> tuple[dict, dict]:
        cfg = dict(data=str(small_data / "train.jsonl"), eval_data="", out=str(tmp_path / name),
                   init=str(tiny_model_dir), steps=1, batch_size=8, lr=1e-2, warmup_steps=1, own_repeats=0,
                   device="cpu", threads=1)
        train(SFTConfig(**{**cfg, **over}), progress=False)
        log = json.loads((tmp_path / f"{name}.sft_log.jsonl").read_text().splitlines()[-1])
        return load_file(tmp_path / name / "model.safetensors"), log

    plain, log = run("plain", weight_decay=0.0)
    decayed, _ = run("decayed", weight_decay=0.5)
    start = load_file(tiny_model_dir / "model.safetensors")
    for name, w in start.items():
        expected = -log["lr"] * 0.5 * w if w.dim() >= 2 else torch.zeros_like(w)
        torch.testing.assert_close(decayed[name] - plain[name], expected, rtol=0, atol=1e-6, msg=name)
    unclipped, log = run("unclipped", grad_clip=0.0)
    never, _ = run("never", grad_clip=1e9)
    tight, tight_log = run("tight", grad_clip=1e-4)
    assert all(torch.equal(unclipped[k], never[k]) for k in unclipped)
    assert not all(torch.equal(unclipped[k], tight[k]) for k in unclipped)
    assert tight_log["grad_norm"] == log["grad_norm"] > 1e-4  # logged before clipping
    wide, _ = run("wide", init=None, preset="tiny", n_positions=400)
    assert wide["transformer.wpe.weight"].shape[0] == 400
    with pytest.raises(ValueError, match=r"samples are longer than the model context \(40 tokens\)"):
        run("short", init=None, preset="tiny", n_positions=40)
    _, tok = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    p = [s for s in read_samples(small_data / "train.jsonl") if s.task == "P"][:1]
    assert tok.decode(encode(tok, p, "padded")[0][0]).startswith(f"P: {p[0].truth.fen:90}M: ")
    assert run("padded", layout="padded")[1]["loss"] != run("compact", layout="compact")[1]["loss"]
    for bad, why in ((dict(grad_clip=-1.0), "grad_clip must be finite and >= 0"),
                     (dict(weight_decay=float("nan")), "weight_decay must be finite and >= 0"),
                     (dict(n_positions=0), "n_positions must be >= 1"), (dict(save_every=0), "save_every must be >= 1"),
                     (dict(eval_every=0), "eval_every must be >= 1"), (dict(layout="padde"), "layout must be one of")):
        with pytest.raises(ValueError, match=f"sft.{why}"):
            SFTConfig(data=str(small_data / "train.jsonl"), **bad).validate()
    for name in ("tensorboard", "wandb"):  # --tensorboard, --wandb without the package: said before the data is read
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(sys.modules, name, None)
            with pytest.raises(ValueError, match=rf"sft.{name} needs the {name} package \(pip install {name}\)"):
                SFTConfig(data=str(small_data / "train.jsonl"), **{name: True}).validate()


@pytest.mark.slow
def test_sft_trains_saves_and_resumes(tmp_path, small_data, capsys):
    import logging

    out = tmp_path / "m"
    cfg = SFTConfig(data=str(small_data / "train.jsonl"), eval_data=str(small_data / "eval.jsonl"), out=str(out),
                    steps=4, batch_size=8, eval_every=2, eval_samples=2, save_every=2, lr=1e-3, warmup_steps=1,
                    device="cpu", threads=1)
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.Logger.warning_once.cache_clear()  # transformers warns once per process: this run's warnings, afresh
    logging.getLogger("transformers").addHandler(handler)
    try:
        train(cfg, progress=False)
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not [s for s in said if "loss_type" in s], said  # the held-out loss named no unknown loss
    log = [json.loads(x) for x in (tmp_path / "m.sft_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert log[-1]["loss"] < log[0]["loss"]
    assert "policy/invalid" in log[1] and "eval_loss_A" in log[1]
    shown = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"step"')]
    assert [r["step"] for r in shown] == [2, 4]  # each evaluation's record, on the console too
    for r in shown:  # to 5 significant digits: an lr of 1e-5 was shown as 0.0 (rounded to 4 decimals)
        assert r["lr"] == pytest.approx(log[r["step"] - 1]["lr"], rel=1e-4) and r["lr"] > 0
    model, tok = load_policy(str(out), device="cpu", verbose=False)
    assert model.config.n_positions == 320
    cfg.steps = 6
    train(cfg, resume=True, progress=False)
    log = [json.loads(x) for x in (tmp_path / "m.sft_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log][-2:] == [5, 6]
    assert f"(its curves: rookworld report {out})" in capsys.readouterr().out
    assert main(["report", str(out)]) == 0  # its curves and its first and last evaluation, beside the model
    page = (tmp_path / "m.report" / "report.html").read_text()
    assert "<th class=\"num\">m: step 2</th><th class=\"num\">step 6</th>" in page
    assert f"<tr><td>held-out loss, A:</td><td class=\"num\">{log[1]['eval_loss_A']:.4f}</td>" in page
    # each evaluation logs what a random legal mover scores on its positions; the report shows it beside the model's
    chance = log[-1]["policy/random/best_acc"]
    assert 0 < chance < 1 and f'{log[-1]["policy/best_acc"]:.4f}</td><td class="num">{chance:.4f}</td>' in page


def test_profile_steps_writes_where_the_steps_of_an_invocation_spend_their_time(tmp_path, small_data, capsys):
    """A GPU machine's run sends back a text file, not a trace: torch.profiler's tables of a few steps, counted
    from the start of each invocation (a resume starts CUDA and the allocator afresh too)."""
    out, path = tmp_path / "m", tmp_path / "m.profile.txt"
    cfg = SFTConfig(data=str(small_data / "train.jsonl"), eval_data="", out=str(out), steps=2, batch_size=4,
                    save_every=1, device="cpu", threads=1, own_repeats=0)
    train(cfg, progress=False)
    assert not path.exists()  # 0: off
    cfg.steps, cfg.profile_steps, cfg.profile_after = 6, 2, 1  # steps 3 (skipped), 4 (the profiler's warm-up), 5-6
    train(cfg, resume=True, progress=False)
    text = path.read_text()
    assert text.startswith("# rookworld sft of m, batch 4, ") and "steps 5-6 on cpu, " in text.splitlines()[0]
    tables = text.split("## by calls")
    assert "## by self_cpu_time_total" in tables[0] and "aten::mm" in tables[0] and "aten::view" in tables[1]
    assert [json.loads(x)["step"] for x in (tmp_path / "m.sft_log.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    cfg.steps, cfg.profile_steps, cfg.profile_after = 7, 5, 0  # the run ends in the profiler's warm-up step
    train(cfg, resume=True, progress=False)
    label = text.split(": steps")[0]
    assert path.read_text() == label + ": no step profiled (the run ended in the profiler's warm-up step 7)\n"
    # a profiler that fails (CUPTI missing on a GPU machine, say) is said and written; the training goes on
    import torch.profiler

    def refuse(*_a, **_k):
        raise RuntimeError("CUPTI unavailable")

    for steps, patch in ((8, (torch.profiler, "profile", refuse)), (10, (torch.profiler.profile, "stop", refuse))):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(*patch)
            cfg.steps, cfg.profile_steps, cfg.profile_after = steps, 1, 0
            train(cfg, resume=True, progress=False)
        assert [json.loads(x)["step"] for x in (tmp_path / "m.sft_log.jsonl").read_text().splitlines()][-1] == steps
        what = "did not start" if steps == 8 else f"failed at its end (step {steps})"
        assert path.read_text() == f"{label}: the profiler {what}: RuntimeError: CUPTI unavailable\n"
        assert f"warning: {label[2:]}: the profiler {what}" in capsys.readouterr().out
    for name in ("profile_steps", "profile_after"):
        with pytest.raises(ValueError, match=f"sft.{name} must be >= 0, got -1"):
            SFTConfig(data=str(small_data / "train.jsonl"), eval_data="", **{name: -1}).validate()


def test_sft_eval_data_missing_is_named_and_empty_means_no_held_out_eval(tmp_path, small_data, tiny_model_dir):
    """A run resumed from another directory once found no data/eval.jsonl.gz and crashed inside the
    tokenizer; a missing file is now named before any work, and '' trains without held-out metrics."""
    common = dict(data=str(small_data / "train.jsonl"), init=str(tiny_model_dir), steps=2, batch_size=4,
                  eval_every=1, eval_samples=2, lr=1e-3, device="cpu", threads=1)
    missing = tmp_path / "nowhere" / "eval.jsonl.gz"
    with pytest.raises(ValueError, match=r"sft.eval_data: .*nowhere/eval.jsonl.gz: no such file"):
        train(SFTConfig(out=str(tmp_path / "a"), eval_data=str(missing), **common), progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.sft_log.jsonl").exists()
    train(SFTConfig(out=str(tmp_path / "b"), eval_data="", **common), progress=False)
    log = [json.loads(x) for x in (tmp_path / "b.sft_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    assert not any(k.startswith(("eval_", "policy/", "environment/")) for r in log for k in r)


def test_sft_on_data_with_nothing_to_learn_stops_before_writing_anything(tmp_path, small_data):
    """An empty data file once trained on empty batches (loss 0, gradient 0) and saved the untrained model as the
    result; A: samples alone with env_share 0 would do the same. Both now stop before anything is written."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    a_only = tmp_path / "a_only.jsonl"
    a_only.write_text("".join(line + "\n" for line in (small_data / "train.jsonl").read_text().splitlines()
                              if json.loads(line)["task"] == "A"))
    common = dict(eval_data="", steps=2, batch_size=4, own_repeats=0, device="cpu", threads=1)
    with pytest.raises(ValueError, match=f"^sft: no training samples in {empty}$"):
        train(SFTConfig(out=str(tmp_path / "e"), data=str(empty), **common), progress=False)
    with pytest.raises(ValueError, match=f"^sft: {a_only} holds only A: samples and env_share is 0: every batch "
                                         "would be empty$"):
        train(SFTConfig(out=str(tmp_path / "a"), data=str(a_only), env_share=0.0, **common), progress=False)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a_only.jsonl", "empty.jsonl"]
    train(SFTConfig(out=str(tmp_path / "b"), data=str(a_only), env_share=0.5, **common), progress=False)  # A: alone
    log = [json.loads(x) for x in (tmp_path / "b.sft_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and all(r["A_rows"] > 0 for r in log)


@pytest.mark.slow
def test_sft_resume_is_exact_and_reads_no_pickle(tmp_path, small_data, monkeypatch, capsys):
    """6 steps straight equal 3 steps, a crash, and 3 resumed steps: the same losses, the same weights.
    The state is safetensors + JSON; a pickle planted beside it is never opened."""
    import rookworld_rlvr.sft as sft

    def config(out):
        return SFTConfig(data=str(small_data / "train.jsonl"), eval_data=str(small_data / "eval.jsonl"),
                         out=str(out), steps=6, batch_size=6, eval_every=100, eval_samples=0, save_every=3,
                         lr=3e-3, warmup_steps=2, device="cpu", threads=1, tokenizer="board")

    straight, split = tmp_path / "straight", tmp_path / "split"
    train(config(straight), progress=False)
    real, calls = sft._accumulate, []

    def crash_at_step_4(*args, **kwargs):  # the first session dies during step 4 (after the step-3 save)
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sft, "_accumulate", crash_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        train(config(split), progress=False)
    monkeypatch.setattr(sft, "_accumulate", real)
    ckpt = tmp_path / "split.checkpoint"
    names = sorted(p.name for p in ckpt.glob("sft_state*"))
    assert names[-2:] == ["sft_state.json", "sft_state.safetensors"] and all(n.endswith(".safetensors") for n in names[:-2])
    assert all(p.stat().st_size < 25_000_000 for p in ckpt.glob("sft_state*"))  # small enough to commit
    (ckpt / "sft_state.pt").write_bytes(b"\x80\x04cos\nsystem\n(S'touch " + str(tmp_path / "pwned").encode() + b"'\ntR.")
    train(config(split), resume=True, progress=False)  # the next session resumes it
    assert not (tmp_path / "pwned").exists()
    assert "in the checkpoint" not in capsys.readouterr().out  # the same settings: nothing to say
    losses = [[json.loads(x)["loss"] for x in (tmp_path / f"{n}.sft_log.jsonl").read_text().splitlines()]
              for n in ("straight", "split")]
    assert len(losses[0]) == 6 and losses[0] == losses[1]
    a, _ = load_policy(str(straight), device="cpu", verbose=False)
    b, _ = load_policy(str(split), device="cpu", verbose=False)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_sft_order_best_first_writes_the_best_move_first(small_data):
    from rookworld_rlvr.data.io import read_samples
    from rookworld_rlvr.chess_tokenizers import build_board_tokenizer
    from rookworld_rlvr.sft import encode

    tok = build_board_tokenizer()
    samples = [s for s in read_samples(small_data / "train.jsonl") if s.task == "P"][:20]
    for s, (ids, n, *_) in zip(samples, encode(tok, samples, "compact", "best-first"), strict=True):
        text = tok.decode(ids[n:-1])
        moves = text.split("E:")[0].split()[1:]
        evals = [float(x) for x in text.split("E:")[1].split("B:")[0].split()]
        assert sorted(moves) == sorted(s.truth.moves) and evals == sorted(evals, reverse=True)
        assert text.split("B: ")[1] == moves[0] and moves[0] in s.truth.best
    with pytest.raises(ValueError, match="sft.order must be one of given, best-first"):
        SFTConfig(data=str(small_data / "train.jsonl"), order="random").validate()


def test_sft_square_tokenizer_trains_a_fresh_model_and_ships_it(tmp_path, small_data, tiny_model_dir):
    out = tmp_path / "sq"
    cfg = SFTConfig(data=str(small_data / "train.jsonl"), eval_data=str(small_data / "eval.jsonl"), out=str(out),
                    tokenizer="square", steps=2, batch_size=4, eval_every=2, eval_samples=0, lr=1e-3,
                    device="cpu", threads=1)
    train(cfg, progress=False)
    model, tok = load_policy(str(out), device="cpu", verbose=False)
    assert len(tok) == 162 and model.config.vocab_size == 162
    assert tok.convert_ids_to_tokens(tok.encode("M: e2e4")) == ["M", ":", " ", "e2", "e4"]
    rec = json.loads((tmp_path / "sq.sft_log.jsonl").read_text().splitlines()[-1])
    # per character, so runs with different tokenizers compare: fewer tokens, more nats each
    assert rec["eval_nats_per_char_P"] < rec["eval_loss_P"]
    with pytest.raises(ValueError, match="sft.tokenizer must be one of char, square, board"):
        SFTConfig(data=str(small_data / "train.jsonl"), tokenizer="bpe").validate()
    with pytest.raises(ValueError, match="fresh models only"):
        SFTConfig(data=str(small_data / "train.jsonl"), tokenizer="char", init=str(tiny_model_dir)).validate()


def test_sft_preset_sets_the_shape_of_a_fresh_model(tmp_path, small_data):
    out = tmp_path / "small"
    cfg = SFTConfig(data=str(small_data / "train.jsonl"), eval_data="", out=str(out), preset="small", steps=1,
                    batch_size=2, eval_samples=0, own_repeats=0, device="cpu", threads=1)
    train(cfg, progress=False)
    model, _ = load_policy(str(out), device="cpu", verbose=False)
    assert (model.config.n_layer, model.config.n_embd, model.config.n_head, model.config.n_positions) == (8, 384, 6, 320)
    with pytest.raises(ValueError, match="sft.preset must be one of tiny, small, wide, gpt2-124m, got 'huge'"):
        SFTConfig(data=str(small_data / "train.jsonl"), preset="huge").validate()


def test_cli_help_lists_every_subcommand(capsys):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    text = capsys.readouterr().out
    for sub in ("data", "eval", "sft", "train", "check-batch", "overfit", "report"):
        assert sub in text


@pytest.mark.parametrize("sub", [["data", "generate"], ["data", "import"], ["data", "stats"], ["eval"], ["sft"],
                                 ["train"], ["check-batch"], ["overfit"], ["report"], ["sweep"]])
def test_every_subcommand_prints_its_help(sub, capsys):
    """argparse formats help lazily: a stray '%' in a field's help only fails here."""
    with pytest.raises(SystemExit) as e:
        main([*sub, "--help"])
    assert e.value.code == 0
    assert "usage: rookworld" in capsys.readouterr().out


def test_every_option_of_every_command_says_what_it_does():
    """`--help` is the reference a user reads first: no option of any command (sft's flags included, which are
    made from its config's fields) may show a bare default, or nothing, in place of what it does."""
    import argparse

    from rookworld_rlvr.cli import build_parser

    def bare(parser: argparse.ArgumentParser, path: list[str]):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from bare(child, [*path, name])
            elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                text = (action.help or "").strip()
                if len(text) < 8 or text.startswith("(default"):
                    yield f"rookworld {' '.join(path)} {'/'.join(action.option_strings) or action.dest}: {text!r}"

    commands = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)][0].choices
    assert {"data", "train", "sft", "eval", "match", "uci", "report", "sweep"} <= set(commands)
    assert list(bare(build_parser(), [])) == []


def test_readme_documents_every_config_field():
    from pathlib import Path

    from rookworld_rlvr.config import help_table

    repo = Path(__file__).resolve().parents[1]
    table = (repo / "docs" / "configuration.md").read_text()
    assert help_table() in table, "docs/configuration.md table is stale: run python scripts/sync_readme.py"
    readme = (repo / "README.md").read_text()
    assert "docs/configuration.md" in readme
    lines = readme.splitlines()
    assert lines[0] == "# rookworld-rlvr" and "make train" in lines[3] and "make test" in lines[4]


def test_state_files_shard_round_trip_and_refuse_what_they_cannot_store(tmp_path):
    """A state split into shards (to stay under a file size limit in git) loads back equal; a shard
    that goes missing is an error naming the file; stale shards of a bigger save are removed."""
    import random

    from rookworld_rlvr.statefile import load_state, save_state

    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 64)).sum().backward()
    opt.step()
    state = {"optimizer": opt.state_dict(), "python_rng": random.getstate(), "torch_rng": torch.get_rng_state(),
             "ids": {3: (1.5, None, "x")}, "inf": float("inf")}
    save_state(tmp_path, "st", state, shard_bytes=8_000)  # each 64 x 64 moment (16 kB) in its own shard
    shards = sorted(p.name for p in tmp_path.glob("st*.safetensors"))
    assert len(shards) >= 4 and all(p.stat().st_size < 20_000 for p in tmp_path.glob("st*.safetensors"))
    back = load_state(tmp_path, "st")
    assert back["ids"] == {3: (1.5, None, "x")} and back["inf"] == float("inf")
    assert back["python_rng"] == state["python_rng"] and torch.equal(back["torch_rng"], state["torch_rng"])
    restored = torch.optim.AdamW(model.parameters())
    restored.load_state_dict(back["optimizer"])
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(v, restored.state_dict()["state"][0][k])
    save_state(tmp_path, "st", {"x": torch.zeros(2)}, shard_bytes=8_000)  # one shard now: the old ones go
    assert sorted(p.name for p in tmp_path.glob("st*.safetensors")) == ["st.safetensors"]
    save_state(tmp_path, "st", state, shard_bytes=8_000)
    (tmp_path / "st.2.safetensors").unlink()
    with pytest.raises(ValueError, match=r"st\.safetensors: not a complete safetensors state"):
        load_state(tmp_path, "st")
    with pytest.raises(TypeError, match=r"state\.bad: cannot store a object"):
        save_state(tmp_path, "st", {"bad": object()})


def test_sft_resume_names_every_setting_that_differs_from_the_checkpoint(tmp_path, small_data, capsys):
    """A resume with other flags is no longer an exact continuation: each difference is printed."""
    base = dict(data=str(small_data / "train.jsonl"), eval_data=str(small_data / "eval.jsonl"), out=str(tmp_path / "m"),
                steps=2, batch_size=4, eval_every=100, eval_samples=0, save_every=1, device="cpu", threads=1)
    train(SFTConfig(**base, lr=1e-3), progress=False)
    capsys.readouterr()
    train(SFTConfig(**{**base, "steps": 3, "threads": 2}, lr=5e-4), resume=True, progress=False)
    out = capsys.readouterr().out
    assert "sft: lr was 0.001 in the checkpoint, now 0.0005 (from this step on)" in out
    assert "sft: steps was 2 in the checkpoint, now 3" in out and "threads was" not in out
    from rookworld_rlvr.sft import changed_settings  # a setting the checkpoint predates had its default's effect

    saved = {k: v for k, v in SFTConfig(**base).__dict__.items() if k != "own_targets"}
    assert changed_settings(saved, SFTConfig(**base).__dict__) == []
    assert changed_settings(saved, SFTConfig(**base, own_targets=5.0).__dict__) == [
        "own_targets was 0.0 in the checkpoint (its default then), now 5.0 (from this step on)"]


def test_sft_autocast_auto_takes_bf16_only_where_the_hardware_does_it_well(tmp_path, small_data, capsys):
    """auto follows the trainer's rule (CUDA with bf16, a CPU with AMX); elsewhere float32, since bf16
    on a CPU without bf16 units runs many times slower. The choice is printed; a typo is refused."""
    from rookworld_rlvr.grpo.precision import autocast_dtype
    from rookworld_rlvr.model import resolve_device

    cfg = SFTConfig(data=str(small_data / "train.jsonl"), eval_data=str(small_data / "eval.jsonl"),
                    out=str(tmp_path / "m"), steps=1, batch_size=4, eval_samples=0, device="cpu", threads=1,
                    autocast="auto")
    train(cfg, progress=False)
    expected = "bf16" if autocast_dtype("auto", resolve_device("cpu")) else "off (float32)"
    assert f"sft: autocast {expected} (auto)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="sft.autocast must be 'none', 'bf16' or 'auto', got 'fp16'"):
        SFTConfig(data=str(small_data / "train.jsonl"), autocast="fp16").validate()


def test_grow_layers_starts_from_the_init_models_exact_outputs_and_the_new_blocks_learn(tmp_path, small_data,
                                                                                       tiny_model_dir):
    """Growing keeps what the base knows: the deeper model computes the same logits (so the first
    step's loss is the unchanged model's), the new blocks move off their no-op start, and a resume
    continues the grown model instead of growing it again."""
    import torch

    from rookworld_rlvr.model.grow import grow_depth, insert_after

    model, tok = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    ids = torch.tensor([tok.encode("P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1 M: e7e5")])
    with torch.no_grad():
        for n in (3, 4, 7):
            grown = grow_depth(model, n)
            assert grown.config.n_layer == n
            assert torch.equal(grown(ids).logits, model(ids).logits)
    assert insert_after(6, 12) == [0, 1, 2, 3, 4, 5] and insert_after(6, 9) == [0, 2, 4]
    with pytest.raises(ValueError, match="growing to 2 layers needs more than the model's 2"):
        grow_depth(model, 2)
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    other = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=32))
    with pytest.raises(ValueError, match="growing works on GPT-2 models, not 'gpt_neox'"):
        grow_depth(other, 2)

    common = dict(data=str(small_data / "train.jsonl"), eval_data="", init=str(tiny_model_dir), steps=2,
                  batch_size=4, eval_samples=0, lr=1e-2, warmup_steps=1, save_every=1, device="cpu", threads=1)
    train(SFTConfig(out=str(tmp_path / "plain"), **common), progress=False)
    cfg = SFTConfig(out=str(tmp_path / "deep"), grow_layers=4, **common)
    train(cfg, progress=False)
    first = [json.loads((tmp_path / f"{name}.sft_log.jsonl").read_text().splitlines()[0])["loss"]
             for name in ("plain", "deep")]
    assert first[0] == first[1]
    deep, _ = load_policy(str(tmp_path / "deep"), device="cpu", verbose=False)
    assert deep.config.n_layer == 4
    for j in (1, 3):  # the added blocks (after blocks 0 and 1)
        assert deep.transformer.h[j].attn.c_proj.weight.abs().sum() > 0
        assert deep.transformer.h[j].mlp.c_proj.weight.abs().sum() > 0
    cfg.steps = 3
    train(cfg, resume=True, progress=False)
    resumed, _ = load_policy(str(tmp_path / "deep"), device="cpu", verbose=False)
    assert resumed.config.n_layer == 4
    with pytest.raises(ValueError, match="grow_layers deepens an --init model"):
        SFTConfig(data=str(small_data / "train.jsonl"), grow_layers=8).validate()
    with pytest.raises(ValueError, match="grow_layers must be >= 0"):
        SFTConfig(data=str(small_data / "train.jsonl"), init=str(tiny_model_dir), grow_layers=-1).validate()


def test_cooldown_steps_take_the_lr_down_a_straight_line_at_the_end_of_a_resumed_run(tmp_path, small_data):
    """--cooldown-steps N: the last N steps of --steps bring the scheduled lr linearly toward zero; a resume
    with a larger --steps ends an already-decayed run on that cooldown (how the shipped base is continued)."""
    base = dict(data=str(small_data / "train.jsonl"), eval_data="", out=str(tmp_path / "m"), steps=3, batch_size=4,
                lr=1e-3, min_lr_ratio=1.0, warmup_steps=1, save_every=1, device="cpu", threads=1)
    train(SFTConfig(**base), progress=False)
    train(SFTConfig(**{**base, "steps": 7, "cooldown_steps": 3}), resume=True, progress=False)
    log = [json.loads(x) for x in (tmp_path / "m.sft_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6, 7]
    assert [r["lr"] for r in log] == pytest.approx([1e-3] * 4 + [7.5e-4, 5e-4, 2.5e-4], rel=1e-12)
    for bad in (-1, 8):
        with pytest.raises(ValueError, match="sft.cooldown_steps must be in"):
            SFTConfig(**{**base, "steps": 7, "cooldown_steps": bad}).validate()
    with pytest.raises(ValueError, match="sft.min_lr_ratio must be in"):
        SFTConfig(**{**base, "min_lr_ratio": 1.5}).validate()


def test_stop_after_minutes_pauses_the_run_and_max_minutes_ends_it(tmp_path, small_data, monkeypatch, capsys):
    """--stop-after-minutes ends an invocation, not the run: the lr keeps the --steps schedule and --resume
    finishes exactly the run one straight invocation makes. --max-minutes is the run's budget: the
    schedule follows it, so the same two minutes end on the decayed lr. A fake clock makes a step a minute."""
    import rookworld_rlvr.sft as sft

    clock, real = [0.0], sft._accumulate

    def one_minute_step(*args, **kwargs):
        clock[0] += 60
        return real(*args, **kwargs)

    monkeypatch.setattr(sft, "_accumulate", one_minute_step)
    monkeypatch.setattr(sft.time, "time", lambda: clock[0])

    def run(name, resume=False, **kw):
        train(SFTConfig(data=str(small_data / "train.jsonl"), eval_data="", out=str(tmp_path / name), steps=6,
                        batch_size=4, own_repeats=0, lr=1e-3, warmup_steps=1, save_every=100, device="cpu",
                        threads=1, **kw), resume=resume, progress=False)
        return [json.loads(x) for x in (tmp_path / f"{name}.sft_log.jsonl").read_text().splitlines()]

    straight = run("straight")
    assert [r["step"] for r in run("split", stop_after_minutes=2)] == [1, 2]
    split = run("split", resume=True)
    assert "in the checkpoint" not in capsys.readouterr().out  # an invocation's length changes nothing computed
    assert [(r["step"], r["lr"], r["loss"]) for r in split] == [(r["step"], r["lr"], r["loss"]) for r in straight]
    budget = run("budget", max_minutes=2)
    assert [r["step"] for r in budget] == [1, 2]
    assert budget[0]["lr"] == straight[0]["lr"] and budget[1]["lr"] < straight[1]["lr"]
    for field in ("stop_after_minutes", "max_minutes"):
        with pytest.raises(ValueError, match=f"sft.{field} must be a positive number of minutes"):
            SFTConfig(data=str(small_data / "train.jsonl"), **{field: 0}).validate()


def test_env_share_sets_the_task_mix_of_each_batch(tmp_path, small_data):
    """--env-share: the share of A: rows in a batch (the rest P:), counted in the step log as A_rows."""
    import random

    from rookworld_rlvr.sft_rows import draw_batch

    by_task = {"A": ["a"] * 5, "P": ["p"] * 5}
    rng = random.Random(0)
    drawn = [draw_batch(rng, by_task, 64, 0.2) for _ in range(100)]
    assert all(len(a) + len(p) == 64 for a, p in drawn)
    assert sum(len(a) for a, _ in drawn) / 6400 == pytest.approx(0.2, abs=0.025)  # 5 sd of 6,400 draws
    assert draw_batch(rng, by_task, 64, 0.0) == ([], ["p"] * 64)
    assert draw_batch(rng, by_task, 64, 1.0) == (["a"] * 64, [])
    assert draw_batch(rng, {"A": [], "P": ["p"]}, 8, 1.0) == ([], ["p"] * 8)

    base = dict(data=str(small_data / "train.jsonl"), eval_data="", steps=2, batch_size=4, own_repeats=0,
                save_every=10, device="cpu", threads=1)
    for share, a_rows in ((0.0, 0), (1.0, 4)):
        train(SFTConfig(**base, out=str(tmp_path / f"m{share}"), env_share=share), progress=False)
        log = [json.loads(x) for x in (tmp_path / f"m{share}.sft_log.jsonl").read_text().splitlines()]
        assert [r["A_rows"] for r in log] == [a_rows, a_rows]
    with pytest.raises(ValueError, match="sft.env_share must be in"):
        SFTConfig(**base, env_share=1.5).validate()


@pytest.mark.parametrize("legal", [False, True])
def test_a_large_training_set_encodes_in_several_processes_to_the_same_rows(legal):
    """`rookworld sft` encodes a large set (a GPU base's 1.5M rows) in forked processes: every row, its targets,
    bans and legal sets equal the one-process encoding, in the same order (here 2 processes from 1 row on)."""
    import itertools
    from pathlib import Path

    from rookworld_rlvr.chess_tokenizers import build_board_tokenizer
    from rookworld_rlvr.data.io import iter_samples
    from rookworld_rlvr.sft_rows import encode, encode_many

    tok = build_board_tokenizer()
    samples = list(itertools.islice(iter_samples(Path(__file__).parents[1] / "data" / "train.jsonl.xz"), 1500))
    assert {s.task for s in samples} == {"P", "A"}
    one = encode(tok, samples, "compact", "best-first", legal=legal)
    many = encode_many(tok, samples, "compact", "best-first", legal=legal, workers=2, min_rows=1)
    assert many == one and len(one) == 1500 and (not legal or any(r.legal for r in one))


@pytest.mark.parametrize("options,notes", [
    ("--eval-data '' --eval-every 50 --eval-samples 10", ["eval_every: no held-out evaluation (eval_data is empty)",
                                                          "eval_samples: no held-out evaluation"]),
    ("--profile-after 5", ["profile_after: no profile is taken (profile_steps 0)"]),
    ("--distinct-coef 0 --own-targets 0.5", ["own_targets: the model answers no rows of its own"]),
    ("--own-repeats 0 --own-targets 0.5", ["own_targets: the model answers no rows of its own"]),
    ("--profile-steps 2 --profile-after 5 --own-targets 0.5 --eval-every 50", []),
], ids=["evaluation-without-eval-data", "profile-after-without-profile", "own-targets-without-distinct",
        "own-targets-without-own-rows", "all-read"])
def test_an_sft_setting_that_nothing_reads_is_named_before_the_run(options, notes, tmp_path, capsys):
    """`rookworld sft` settings that only tune something this run does not do were taken without a word; now each is
    a warning of a setting without effect before the run (here, before data with nothing to learn stops it)."""
    import shlex

    from rookworld_rlvr.cli import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["sft", "--data", str(empty), "--out", str(tmp_path / "m"), *shlex.split(options)]) == 1
    said = [line.removeprefix("sft: warning: setting without effect: ") for line in capsys.readouterr().err.splitlines()
            if line.startswith("sft: warning: setting without effect: ")]
    assert len(said) == len(notes) and all(s.startswith(n) for s, n in zip(said, notes)), said
