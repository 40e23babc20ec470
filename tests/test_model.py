"""Tokenizers, loading (strict about weights), atomic saving and plain-HF compatibility."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2LMHeadModel

from rookworld_rlvr.atomic import SaveError
from rookworld_rlvr.chess_tokenizers import build_board_tokenizer, build_chess_tokenizer, build_square_tokenizer
from rookworld_rlvr.model import (
    ModelLoadError,
    generate,
    load_policy,
    resolve_device,
    resolve_dtype,
    save_pretrained_atomic,
    tf32_unless_chosen,
    tiny_config,
)

from conftest import (  # noqa: E402
    REFERENCE, REPO, SAMPLES, make_tokenizer, random_transitions, tiny_gpt2, unchosen_float32_matmul,
)
from numerics import assert_rounding_close, logprob_terms  # noqa: E402
PROMPTS = [
    "P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34 ",
    "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+",
    f"P: {'1b1k4/6p1/1P3pp1/2P1n3/4RP1r/8/2K5/4B3 b - - 1 60':90}",
    "P: 8/8/8/8/8/8/8/K6k w - - 0 1 ",
    "A: 8/8/8/8/8/8/8/K6k w - - 0 1+a1a2+a1a2+",
]


pytestmark = pytest.mark.usefixtures("one_thread")


def read_reference() -> list[str]:
    if not REFERENCE.exists():
        pytest.fail(f"reference file {REFERENCE} not present")
    return REFERENCE.read_text().split("\n")


# 6. tokenizers -----------------------------------------------------------------------------------


def test_chess_tokenizer_vocabulary():
    tok = build_chess_tokenizer()
    assert len(tok) == 98
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<unk>", " ", "~", "\n"]) == [0, 1, 2, 96, 97]
    assert tok.eos_token_id == tok.bos_token_id == tok.pad_token_id == 0
    assert tok.padding_side == "left"
    text = "P: 8/8   x"
    assert tok.encode(text) == tok.convert_tokens_to_ids(list(text))  # one id per char, no BOS
    assert tok.encode("é") == [tok.unk_token_id]
    assert tok.encode("ab<|endoftext|>") == tok.convert_tokens_to_ids(["a", "b"]) + [0]


def test_square_tokenizer_splits_squares_only_inside_moves():
    tok = build_square_tokenizer()
    assert len(tok) == 98 + 64 and tok.eos_token_id == tok.pad_token_id == 0
    chars = build_chess_tokenizer()
    assert all(tok.convert_ids_to_tokens(i) == chars.convert_ids_to_tokens(i) for i in range(len(chars)))
    text = "P: 1b1b4/8/8/8/8/8/8/b1b1K2k w - e3 0 1 M: e2e4  d7d8q B: b1c3"
    pieces = tok.convert_ids_to_tokens(tok.encode(text))
    # the FEN's bishop-and-count pairs (b1, b4) and the en-passant field stay characters
    assert pieces[:11] == list("P: 1b1b4/8/") and "e" in pieces and "3" in pieces
    assert pieces[-13:] == ["e2", "e4", " ", " ", "d7", "d8", "q", " ", "B", ":", " ", "b1", "c3"]
    assert [p for p in pieces if len(p) == 2] == ["e2", "e4", "d7", "d8", "b1", "c3"]
    a_line = "A: b1b4k2/8/8/8/8/8/8/4K3 w - - 0 1+b1c3+e2e4 b1c3+b1b4k2/8/8/8/8/8/8/4K3 b - - 1 1+0.001+0+0"
    pieces = tok.convert_ids_to_tokens(tok.encode(a_line))
    assert [p for p in pieces if len(p) == 2] == ["b1", "c3", "e2", "e4", "b1", "c3"]
    assert len(pieces) == len(a_line) - 6


@pytest.mark.parametrize("kind", ["char", "square", "board", "bpe"])
def test_round_trip_reference_file(kind):
    lines = read_reference()
    assert len(lines) == 500
    tok = make_tokenizer(kind)
    for number, line in enumerate(lines, 1):
        ids = tok.encode(line)
        assert tok.unk_token_id not in ids or kind == "bpe", f"line {number}: unknown char"
        if kind == "square" and line.startswith("P: "):
            assert len(ids) < len(line), f"line {number}: moves should be square tokens"
        assert tok.decode(ids) == line, f"line {number}"
    for text in SAMPLES + PROMPTS + ["  two  spaces \n newline  ", ""]:
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("kind", ["char", "square", "board", "bpe"])
def test_tokenizer_saves_and_loads_with_autotokenizer(kind, tmp_path):
    tok = make_tokenizer(kind)
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").exists()
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in SAMPLES + PROMPTS:
        assert loaded.encode(text) == tok.encode(text)
    assert loaded.padding_side == "left" and loaded.pad_token_id == loaded.eos_token_id == 0
    short, long = sorted(PROMPTS[:2], key=lambda t: len(loaded.encode(t)))
    mask = loaded([short, long], padding=True)["attention_mask"]
    assert mask[0][0] == 0 and mask[0][-1] == 1 and mask[1][0] == 1  # padded on the left
    for text in SAMPLES + PROMPTS:  # the loaded decoder folds what the loaded normalizer expanded
        assert loaded.decode(loaded.encode(text)) == text


def board_words(tok, text: str) -> list[list[str]]:
    """The token runs between " " / "+" that hold a "/": the FEN boards as the model sees them."""
    pieces = tok.convert_ids_to_tokens(tok.encode(text))
    words, cur = [], []
    for p in pieces + [" "]:
        if p in (" ", "+"):
            if "/" in cur:
                words.append(cur)
            cur = []
        else:
            cur.append(p)
    return words


def test_board_tokenizer_writes_every_square_at_a_fixed_offset():
    tok = build_board_tokenizer()
    assert len(tok) == 162 and tok.convert_ids_to_tokens(tok.encode("M: e2e4")) == ["M", ":", " ", "e2", "e4"]
    line = "A: rnbqkb1r/pppppppp/5n2/8/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 1 2+b1c3+e2e4 g8f6 b1c3+" \
           "rnbqkb1r/pppppppp/5n2/8/4P3/2N5/PPPP1PPP/R1BQKBNR b KQkq - 2 2+0.001+0+0"
    ids = tok.encode(line)
    assert tok.decode(ids) == line
    first, second = board_words(tok, line)
    assert "".join(first) == "rnbqkb_r/pppppppp/_____n__/________/____P___/________/PPPP_PPP/RNBQKBNR"
    assert "".join(second).split("/")[5] == "__N_____"
    # the move words keep their square tokens and their digits (b2b4 looks like bishop-2-bishop-4)
    moves = "P: 1b1b4/8/8/8/8/8/8/b1b1K2k w - e3 0 1 M: b2b4  b7b8q B: b1c3"
    pieces = tok.convert_ids_to_tokens(tok.encode(moves))
    assert [p for p in pieces if len(p) == 2] == ["b2", "b4", "b7", "b8", "b1", "c3"]
    assert tok.decode(tok.encode(moves)) == moves
    assert ["".join(w) for w in board_words(tok, moves)] == ["_b_b____/" + "________/" * 6 + "b_b_K__k"]


def test_board_tokenizer_round_trips_every_fen_the_tasks_write():
    """Every A: transition (checkmates, promotions, castling, en passant, illegal moves) and every
    P: sample: prompt and completion tokenized apart, as in training, decode to the same text,
    and every board is 71 tokens with no digit left."""
    from rookworld_rlvr.data.io import Sample

    tok = build_board_tokenizer()
    texts = []
    for t in random_transitions(400, seed=3):
        prompt, completion = Sample("A", t).render()
        texts += [prompt, completion, prompt + completion]
    texts += [line for line in read_reference()]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text
        for word in board_words(tok, text):
            assert len(word) == 71 and not any(ch.isdigit() for p in word for ch in p), text


def test_bpe_tokenizer_is_multi_char():
    tok = make_tokenizer("bpe")
    assert len(tok) == 512 and tok.eos_token_id == 0
    assert len(tok.encode(SAMPLES[0])) < len(SAMPLES[0])


# Devices, dtypes, configs ------------------------------------------------------------------------


def test_float32_products_take_tf32_unless_the_process_chose_their_precision(float32_matmul):
    """What `resolve_device` does on CUDA (the flags are the same on a CPU build): TF32 where nobody chose,
    and a choice of IEEE float32 kept, made with either of torch's interfaces."""
    assert tf32_unless_chosen() and float32_matmul.allow_tf32 and float32_matmul.fp32_precision == "tf32"
    assert torch.get_float32_matmul_precision() == "high"  # the getters inductor reads agree
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"  # CPU products untouched
    assert not tf32_unless_chosen()  # chosen now (by the call before): kept
    for choose in (lambda: setattr(float32_matmul, "allow_tf32", False),
                   lambda: torch.set_float32_matmul_precision("highest"),
                   lambda: setattr(torch.backends, "fp32_precision", "ieee")):
        unchosen_float32_matmul()
        choose()
        assert not tf32_unless_chosen() and not float32_matmul.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest"


def test_resolve_device_and_dtype():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in {"cpu", "cuda", "mps"}
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:1")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("gpu0")
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("float16") is torch.float16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float8")


def test_tiny_config_presets():
    cfg = tiny_config(98)
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions) == (6, 256, 8, 256)
    assert cfg.eos_token_id == cfg.bos_token_id == cfg.pad_token_id == 0
    with torch.device("meta"):  # count parameters without allocating them
        assert 4.5e6 < GPT2LMHeadModel(cfg).num_parameters() < 5.5e6
        for preset, shape, (low, high) in (("small", (8, 384, 6), (13e6, 15e6)), ("wide", (6, 512, 8), (18e6, 20e6))):
            mid = tiny_config(162, preset=preset, n_positions=320)
            assert (mid.n_layer, mid.n_embd, mid.n_head) == shape
            assert low < GPT2LMHeadModel(mid).num_parameters() < high
        big = tiny_config(50257, preset="gpt2-124m")
        assert (big.n_layer, big.n_embd, big.n_head, big.n_positions) == (12, 768, 12, 1024)
        assert 123e6 < GPT2LMHeadModel(big).num_parameters() < 125e6
    with pytest.raises(ValueError, match="preset"):
        tiny_config(98, preset="huge")


# 4. save atomically, load with plain transformers, same greedy tokens ----------------------------


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_checkpoint_loads_with_plain_transformers(kind, tmp_path):
    tok = make_tokenizer(kind)
    model = tiny_gpt2(len(tok))
    out = tmp_path / "ckpt"
    save_pretrained_atomic(model, tok, out)
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp dirs left behind

    hf_model = AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tok = AutoTokenizer.from_pretrained(out)
    ours = generate(model, tok, PROMPTS, max_new_tokens=40, greedy=True)
    assert set(ours.finish_reasons) == {"eos", "length"}
    enc = hf_tok(PROMPTS, padding=True, return_tensors="pt")
    assert torch.equal(enc["input_ids"], ours.prompt_ids) and torch.equal(enc["attention_mask"], ours.prompt_mask)
    with torch.no_grad():
        hf_out = hf_model.generate(
            **enc, max_new_tokens=40, do_sample=False, pad_token_id=hf_tok.pad_token_id, eos_token_id=hf_tok.eos_token_id
        )
    hf_completion = hf_out[:, enc["input_ids"].shape[1] :]
    assert torch.equal(hf_completion, ours.completion_ids)
    texts = hf_tok.batch_decode(hf_completion, skip_special_tokens=True)
    assert texts == ours.texts


def test_save_replaces_existing_checkpoint(tmp_path):
    tok = build_chess_tokenizer()
    out = tmp_path / "ckpt"
    save_pretrained_atomic(tiny_gpt2(len(tok), seed=0), tok, out)
    second = tiny_gpt2(len(tok), seed=1)
    save_pretrained_atomic(second, tok, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    loaded = load_file(out / "model.safetensors")
    assert torch.equal(loaded["transformer.wte.weight"], second.transformer.wte.weight)
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["padding_side"] == "left"


def test_saves_and_loads_print_no_progress_bar(tmp_path, capfd):
    """A bar per checkpoint buried the training run's own progress output, and one per load ("Loading
    weights") a match's; transformers' bars are as they were after."""
    from transformers.utils import logging as hf_logging

    from rookworld_rlvr.grpo.checkpoint import save_checkpoint

    tok = build_chess_tokenizer()
    model = tiny_gpt2(len(tok), seed=0)
    was_on = hf_logging.is_progress_bar_enabled()  # another test may have turned them off
    hf_logging.enable_progress_bar()
    try:
        save_pretrained_atomic(model, tok, tmp_path / "final")
        save_checkpoint(tmp_path, 1, model, tok, {"step": 1})
        load_policy(str(tmp_path / "final"), device="cpu", verbose=False)
        assert hf_logging.is_progress_bar_enabled()
    finally:
        if not was_on:
            hf_logging.disable_progress_bar()
    err = capfd.readouterr().err
    assert "Writing model shards" not in err and "Loading weights" not in err and "%|" not in err
    assert (tmp_path / "checkpoints" / "step_000001" / "model.safetensors").exists()


def test_failed_save_leaves_previous_checkpoint(tmp_path, monkeypatch):
    tok = build_chess_tokenizer()
    out = tmp_path / "ckpt"
    model = tiny_gpt2(len(tok))
    save_pretrained_atomic(model, tok, out)
    before = (out / "model.safetensors").read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(type(tok), "save_pretrained", crash)
    with pytest.raises(SaveError, match=f"^cannot write {out}: disk full; the one there before is kept$"):
        save_pretrained_atomic(tiny_gpt2(len(tok), seed=5), tok, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert (out / "model.safetensors").read_bytes() == before
    monkeypatch.setattr(type(tok), "save_pretrained", lambda *a, **k: 1 / 0)  # a fault of the code stays as it is
    with pytest.raises(ZeroDivisionError):
        save_pretrained_atomic(tiny_gpt2(len(tok), seed=5), tok, out)
    assert (out / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_a_saved_model_reads_as_the_umask_says_not_private(tmp_path, umask):
    """Temporary directories are 0700 and safetensors writes 0600: published, a model directory and its files get
    what a plain mkdir and write would (a model saved on a shared machine reads like any other file there)."""
    tok = build_chess_tokenizer()
    before = os.umask(umask)
    try:
        out = save_pretrained_atomic(tiny_gpt2(len(tok)), tok, tmp_path / "model")
    finally:
        os.umask(before)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {p.name: 0o666 & ~umask for p in out.iterdir()}


# 5. strict loading -------------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    tok = build_chess_tokenizer()
    out = tmp_path / "ckpt"
    save_pretrained_atomic(tiny_gpt2(len(tok)), tok, out)
    return out


def edit_weights(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_load_policy_local(checkpoint, capsys):
    model, tok = load_policy(str(checkpoint), device="cpu")
    assert not model.training
    assert all(p.requires_grad for p in model.parameters())
    assert next(model.parameters()).dtype == torch.float32
    assert tok.padding_side == "left" and tok.pad_token_id == tok.eos_token_id == 0
    # the load's trial batch (padded) left no padding on the backend, which encodes SFT's rows one by one
    assert tok.backend_tokenizer.padding is None and len(tok.backend_tokenizer.encode_batch(["a", "a b c"])[0]) == 1
    report = capsys.readouterr().out
    assert "parameters" in report and "local" in report and "cpu" in report and "float32" in report
    bf16, _ = load_policy(str(checkpoint), device="cpu", dtype="bfloat16", verbose=False)
    assert next(bf16.parameters()).dtype == torch.bfloat16
    assert capsys.readouterr().out == ""


def test_load_policy_fuses_gelu_without_changing_outputs_or_config(checkpoint):
    from transformers import AutoModelForCausalLM
    from transformers.activations import GELUTanh, NewGELUActivation

    plain = AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
    model, _ = load_policy(str(checkpoint), device="cpu", verbose=False)
    assert any(isinstance(m, NewGELUActivation) for m in plain.modules())
    assert not any(isinstance(m, NewGELUActivation) for m in model.modules())
    assert sum(isinstance(m, GELUTanh) for m in model.modules()) == model.config.n_layer
    x = torch.randint(1, model.config.vocab_size, (3, 40))
    assert_rounding_close(model(x).logits, plain(x).logits, logprob_terms(model), "fused GELU logits")
    assert model.config.activation_function == "gelu_new"  # saved models stay the same


def test_load_policy_sets_missing_pad_token(checkpoint):
    config_path = checkpoint / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("pad_token", None)
    config["padding_side"] = "right"
    config_path.write_text(json.dumps(config))
    _, tok = load_policy(str(checkpoint), device="cpu", verbose=False)
    assert tok.pad_token == tok.eos_token and tok.padding_side == "left"


def test_load_policy_missing_weight_raises(checkpoint):
    edit_weights(checkpoint, lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"))
    with pytest.raises(ModelLoadError, match=r"missing_keys: transformer\.h\.1\.mlp\.c_fc\.weight"):
        load_policy(str(checkpoint), device="cpu", verbose=False)


def test_a_weights_file_cut_short_is_named_as_damaged(checkpoint):
    """safetensors' own words ("incomplete metadata, file not fully covered") name neither the file nor the fault."""
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=rf"model {checkpoint}: its safetensors weights could not be read, a file "
                                             r"cut short or damaged \(model\.safetensors\): "):
        load_policy(str(checkpoint), device="cpu", verbose=False)


def test_weights_of_an_integer_dtype_or_holding_nan_are_refused_by_name(checkpoint):
    """transformers cast an integer tensor to the model's float dtype and took NaN as it came: `rookworld eval`
    then judged a model of integers or NaN without a word (0% legal, as if it were the model's own skill)."""
    tensors = load_file(checkpoint / "model.safetensors")
    edit_weights(checkpoint, lambda t: t.update({"transformer.wpe.weight": tensors["transformer.wpe.weight"].long()}))
    with pytest.raises(ModelLoadError, match=rf"^model {checkpoint}: model\.safetensors holds "
                                             r"transformer\.wpe\.weight as I64, not floating point: a damaged or "
                                             r"edited file\?$"):
        load_policy(str(checkpoint), device="cpu", verbose=False)
    nan = {k: tensors[k].clone() for k in ("transformer.wpe.weight", "transformer.h.1.mlp.c_fc.bias")}
    nan["transformer.wpe.weight"][3, 4] = float("nan")
    nan["transformer.h.1.mlp.c_fc.bias"][0] = float("-inf")
    edit_weights(checkpoint, lambda t: t.update(nan))
    with pytest.raises(ModelLoadError, match=rf"^model {checkpoint}: its weights hold NaN or infinite values "
                                             r"\(transformer\.wpe\.weight, transformer\.h\.1\.mlp\.c_fc\.bias\)"):
        load_policy(str(checkpoint), device="cpu", verbose=False)
    nan["transformer.wpe.weight"][3, 4] = 1.0  # half-precision weights load: a float dtype is not a fault
    edit_weights(checkpoint, lambda t: t.update({k: v.to(torch.bfloat16) for k, v in nan.items()}))
    with pytest.raises(ModelLoadError, match=r"\(transformer\.h\.1\.mlp\.c_fc\.bias\)"):
        load_policy(str(checkpoint), device="cpu", verbose=False)
    half = tensors["transformer.h.1.mlp.c_fc.bias"].to(torch.float16)
    edit_weights(checkpoint, lambda t: t.update({"transformer.h.1.mlp.c_fc.bias": half}))
    assert load_policy(str(checkpoint), device="cpu", verbose=False)[0].transformer.wpe.weight[3, 4] == 1.0


@pytest.mark.parametrize("pickled", ["pytorch_model.bin", "adapter_model.bin"])
def test_a_model_directory_whose_weights_are_a_pickle_is_refused_without_reading_it(checkpoint, pickled):
    """A directory with pytorch_model.bin and no model.safetensors loaded: transformers unpickles it. Models here
    are read from safetensors alone, so a model someone hands over cannot run code as it loads."""
    weights = checkpoint / "model.safetensors"
    torch.save(load_file(weights), checkpoint / pickled)  # the same weights, pickled: transformers would load them
    weights.unlink()
    if pickled == "adapter_model.bin":  # a PEFT adapter's directory: its config names the base it goes on
        (checkpoint / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(checkpoint)}))
        (checkpoint / "config.json").unlink()
        safe = "adapter_model.safetensors"
    else:
        safe = "model.safetensors"
    with pytest.raises(ModelLoadError, match=rf"^model {checkpoint}: its weights are {pickled}, a pickle, with no "
                                             rf"{safe} beside it: models are read from safetensors alone"):
        load_policy(str(checkpoint), device="cpu", verbose=False)


@pytest.mark.parametrize("file,edit,said", [
    ("config.json", lambda c: c.update(n_head={"a": 1}), r"its config\.json could not be used "
                                                         r"\(StrictDataclassFieldValidationError: .*'n_head'"),
    ("config.json", lambda c: c.update(n_embd=0), r"its config\.json could not be used \(ZeroDivisionError"),
    ("tokenizer.json", lambda c: c.pop("added_tokens"), r"its tokenizer files \(tokenizer\.json, "
                                                        r"tokenizer_config\.json\) could not be used \(KeyError"),
    ("tokenizer.json", lambda c: c["model"].update(unk_token=-1), r"its tokenizer files .* could not be used "
                                                                  r"\(Exception: invalid type: integer `-1`"),
    ("tokenizer_config.json", lambda c: c.update(pad_token=7), r"its tokenizer files .* could not be used "
                                                               r"\(TypeError: Special token pad_token"),
    # read without a word, then the first batch's length check compared a number with it
    ("tokenizer_config.json", lambda c: c.update(model_max_length=""), r"its tokenizer files .* could not be used "
                                                                       r"\(TypeError: '>' not supported"),
])
def test_a_config_or_tokenizer_file_holding_what_transformers_cannot_use_is_named(checkpoint, file, edit, said):
    """A value of the wrong kind in a model directory's config or tokenizer files (a damaged or hand-edited copy)
    stopped `rookworld train --model DIR` with a traceback from transformers, huggingface_hub or tokenizers (58 of
    120 such edits of models/rookworld-board); now one ModelLoadError names the model and the files."""
    path = checkpoint / file
    tree = json.loads(path.read_text())
    edit(tree)
    path.write_text(json.dumps(tree))
    with pytest.raises(ModelLoadError, match=rf"^model {checkpoint}: {said}.*\): a damaged or edited file\?$"):
        load_policy(str(checkpoint), device="cpu", verbose=False)


def test_load_policy_unexpected_and_mismatched_raise(checkpoint):
    edit_weights(checkpoint, lambda t: t.update({"transformer.extra.weight": torch.zeros(3)}))
    with pytest.raises(ModelLoadError, match=r"unexpected_keys: transformer\.extra\.weight"):
        load_policy(str(checkpoint), device="cpu", verbose=False)
    edit_weights(checkpoint, lambda t: t.update({"transformer.ln_f.weight": torch.zeros(7)}))
    with pytest.raises(ModelLoadError, match=r"mismatched_keys: .*transformer\.ln_f\.weight"):
        load_policy(str(checkpoint), device="cpu", verbose=False)


def test_load_policy_ignores_benign_attn_bias_buffer(checkpoint):
    edit_weights(checkpoint, lambda t: t.update({"transformer.h.0.attn.bias": torch.ones(1, 1, 256, 256)}))
    model, _ = load_policy(str(checkpoint), device="cpu", verbose=False)
    assert not model.training


def test_a_mistyped_model_path_is_named_with_the_models_beside_it_before_any_hub_call(tmp_path, monkeypatch, capsys):
    """`models/rookworld-bord` is owner/name to the Hub, which offline retries for a minute and then
    talks of internet connections. Where `models/` is a directory here it is a path: the error says
    so at once and names the models that are there; a run directory names the models in it."""
    import transformers

    from rookworld_rlvr.cli import main
    from rookworld_rlvr.model.load import local_model_problem

    def no_hub(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(REPO / "data")  # the commands' default data, as in the repository
    for d in ("models/board", "runs/r/final", "runs/r/checkpoints/step_000020"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "config.json").write_text("{}")
    (tmp_path / "runs/r/config.yaml").write_text("steps: 1\n")
    with pytest.raises(ModelLoadError, match=r"no such model directory: models/bord \(read as a path, not a Hub id: "
                                             r"models/ is a directory here\); models in models: models/board$"):
        load_policy("models/bord", device="cpu")
    with pytest.raises(ModelLoadError, match=r"runs/r is a directory without a model \(no config.json\); models in "
                                             r"it: runs/r/final, runs/r/checkpoints/step_000020$"):
        load_policy("runs/r", device="cpu")
    with pytest.raises(ModelLoadError, match="runs/r/config.yaml is a file, not a model directory"):
        load_policy("runs/r/config.yaml", device="cpu")
    with pytest.raises(ModelLoadError, match=r"no such model directory: \S*nope/model \(not a Hub id"):
        load_policy(str(tmp_path / "nope" / "model"), device="cpu")
    assert local_model_problem("jrahn/RookWorld-LM-124M") is None and local_model_problem("gpt2") is None
    assert local_model_problem("models/board") is None
    (tmp_path / "models/adapter").mkdir()
    (tmp_path / "models/adapter/adapter_config.json").write_text("{}")
    assert local_model_problem("models/adapter") is None  # a PEFT adapter: transformers loads its base with it
    (tmp_path / "models/adapter/adapter_config.json").write_text('{\n  "r": 8,\n  "base_model_name_or_path": x\n}')
    with pytest.raises(ModelLoadError, match=r"^models/adapter/adapter_config.json:3: not valid JSON \(Expecting "
                                             r"value, column 30\)$"):
        load_policy("models/adapter", device="cpu")
    # each command says it in one line, no traceback
    for argv in (["train", "--model", "models/bord", "--steps", "1", "--output-dir", "out"],
                 ["train", "--model", "models/bord", "--dry-run", "--data", "data/eval.jsonl.gz"],
                 ["match", "models/bord", "random", "--games", "2", "--quiet"],
                 ["eval", "--model", "models/bord", "--data", "data/eval.jsonl.gz", "--limit", "1"]):
        assert main(argv) == 1, argv
        said = capsys.readouterr()
        assert "no such model directory: models/bord" in said.out + said.err and "Traceback" not in said.err, argv


def test_pad_puts_each_row_flush_left_or_right_with_its_mask():
    """The one padding rule (prompts on the left, completions on the right), written by hand: empty rows, a
    minimum width and float values included."""
    from rookworld_rlvr.model.padding import pad

    ids, mask = pad([[1, 2, 3], [], [4]], 0, "left", width=4)
    assert ids.tolist() == [[0, 1, 2, 3], [0, 0, 0, 0], [0, 0, 0, 4]] and ids.dtype == torch.long
    assert mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 1]] and mask.dtype == torch.long
    ids, mask = pad([[1, 2, 3], [], [4]], 9, "right")
    assert ids.tolist() == [[1, 2, 3], [9, 9, 9], [4, 9, 9]] and mask.tolist() == [[1, 1, 1], [0, 0, 0], [1, 0, 0]]
    vals, _ = pad([[0.5, -1.25], [2.0]], 0.0, "right", width=3, dtype=torch.float32)
    assert vals.tolist() == [[0.5, -1.25, 0.0], [2.0, 0.0, 0.0]] and vals.dtype == torch.float32
    assert pad([], 0, "left", width=2)[0].shape == (0, 2)
    with pytest.raises(ValueError, match="side"):
        pad([[1]], 0, "middle")


def test_causal_mask_for_right_padded_rows_gives_the_padding_masks_logits(tiny_model_dir):
    """SFT's forward takes a ready causal mask (SDPA under transformers 5), so transformers reads nothing back to
    the host: on every real token the logits equal those under the 2D padding mask. An eager model gets None
    (it takes the 2D mask)."""
    from transformers import GPT2LMHeadModel

    from rookworld_rlvr.model.padding import causal_mask, pad

    model = GPT2LMHeadModel.from_pretrained(str(tiny_model_dir)).eval()
    ids, mask = pad([[5, 6, 7, 8, 9], [5, 6], [7, 8, 9]], 0, "right")
    ready = causal_mask(model, ids)
    assert ready.shape == (3, 1, 5, 5) and ready.dtype == torch.bool and torch.equal(ready[0, 0], torch.ones(5, 5).tril().bool())
    with torch.no_grad():
        want, got = (model(input_ids=ids, attention_mask=m).logits for m in (mask, ready))
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)
    eager = GPT2LMHeadModel.from_pretrained(str(tiny_model_dir), attn_implementation="eager")
    assert causal_mask(eager, ids) is None
