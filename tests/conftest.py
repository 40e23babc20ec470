import gzip
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import chess
import pytest
import torch

from rookworld_rlvr.tasks import environment as env_task

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "data" / "reference" / "rook_val_500.txt"  # upstream sample, see its README

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# `make test` runs the suite in parallel processes (pytest-xdist, -n): each gets an equal share of the cores,
# and so do the scripts its tests start (OMP_NUM_THREADS), so that no process's threads wait on another's.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_share)
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))

# Tools beyond the Python packages: `make test` installs them (scripts/ensure_stockfish.sh,
# scripts/ensure_chromium.sh). Where one is missing, a test that needs it is skipped with the
# command that installs it; with ROOKWORLD_TEST_STRICT=1 (CI sets it) that is a failure, and so is
# any other skip: on a machine `make test` set up, no test may be skipped.
STRICT = os.environ.get("ROOKWORLD_TEST_STRICT") == "1"


def built_once(tmp_path_factory, worker_id: str, name: str, build) -> Path:
    """A folder that `build(folder)` fills once per pytest run and pytest-xdist's workers share: a module
    fixture that ran two ranks (10-40 s) was built again on every worker that ran one of its tests, both at once
    on 2 cores. The first worker to ask builds it under a lock; the others wait for it and read it."""
    import fcntl
    import shutil

    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # under xdist, each worker's folder lies in the run's own
        root = root.parent
    out = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / ".built").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            (out / ".built").touch()
    return out


def held_out_files() -> list[Path]:
    """The held-out files, as scripts/held_out.sh lists them for the GPU scripts (the one list)."""
    import subprocess

    names = subprocess.run(["bash", "-c", ". scripts/held_out.sh; printf '%s\\n' \"${held[@]}\""], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    return [REPO / n for n in names]


def missing_tool(tool: str, install: str) -> None:
    message = f"{tool} is not installed: {install}"
    if STRICT:
        pytest.fail(f"{message} (ROOKWORLD_TEST_STRICT=1: a missing tool fails the run)", pytrace=False)
    pytest.skip(message)


@pytest.hookimpl(trylast=True)  # after pytest's own order (by fixture), which this sort keeps otherwise
def pytest_collection_modifyitems(config, items):
    """Tests marked slow (10 s or more) run first, the longest (`slow(seconds=N)`) first of all. pytest-xdist gives
    each process a contiguous share of the tests and an idle one takes tests from the end of another's share, so
    a long test late in the order ran alone at the end: about a minute of the suite's 9 on 2 cores."""
    def order(item) -> tuple[bool, float]:
        slow = item.get_closest_marker("slow")
        return slow is None, -(slow.kwargs.get("seconds", 10) if slow else 0)

    items.sort(key=order)


@pytest.fixture(scope="session", autouse=True)
def subprocess_tmpdir(tmp_path_factory) -> Iterator[None]:
    """The processes the tests start keep their temporary files in pytest's folder, which pytest clears, not in
    /tmp: torchrun makes a torchelastic_* folder at each launch and leaves it (about 25 a run of the suite)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp_path_factory.mktemp("tmp")))
        yield


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if STRICT and skipped and session.exitstatus == 0:
        reporter.write_line(f"ROOKWORLD_TEST_STRICT=1: {len(skipped)} skipped test(s) fail the run", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def packs_weights(model) -> bool:
    """Whether the decode steps and no-grad passes run on oneDNN-packed weights here. torch's x86-64
    CPU builds ship oneDNN, so the tests require it there; on other CPUs (aarch64) they check what
    `can_pack` reports: packed results where it packs, the modules' own forward where it does not."""
    import platform

    from rookworld_rlvr.model import gpt2_decode

    packs = gpt2_decode.can_pack(model)
    assert packs or platform.machine().lower() not in ("x86_64", "amd64"), "torch's x86-64 CPU builds ship oneDNN"
    return packs


def build_bpe_tokenizer(texts, vocab_size: int = 512):
    """Byte-level BPE (GPT-2 style) trained on `texts`; lossless for any input: checks that nothing
    in the model package assumes one token per character. Byte-level BPE never needs an unknown
    token, so unk is `<|endoftext|>` as in GPT-2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from rookworld_rlvr.chess_tokenizers import EOS_TOKEN, with_conventions

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],  # first special token -> id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return with_conventions(tok, EOS_TOKEN)


# a P: and an A: sample in the upstream format, for tokenizer round trips
SAMPLES = [
    "P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34 M: a4a3 c8f5 h7f6 h7g5 h7f8 "
    "E: -3.06 -2.82 -3.21 -3.16 -2.3 B: h7f6",
    "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+"
    "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1+0.001+0+0",
]


def make_tokenizer(kind: str):
    """One of the shipped tokenizers (char, square, board), or a BPE trained on the upstream samples (bpe)."""
    from rookworld_rlvr.chess_tokenizers import build_board_tokenizer, build_chess_tokenizer, build_square_tokenizer

    builders = {"char": build_chess_tokenizer, "square": build_square_tokenizer, "board": build_board_tokenizer,
                "bpe": lambda: build_bpe_tokenizer(REFERENCE.read_text().split("\n"))}
    return builders[kind]()


def tiny_gpt2(vocab_size: int, eos_boost: float = 1.5, n_positions: int = 256, seed: int = 0):
    """Random 2x64 GPT-2 in eval mode; init 0.1 gives varied (non-looping) text, and the final LayerNorm is
    shifted so that the EOS logit (id 0) rises by exactly `eos_boost`, which makes EOS reachable."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_layer=2, n_embd=64, n_head=4,
                     bos_token_id=0, eos_token_id=0, pad_token_id=0, initializer_range=0.1)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        e = model.transformer.wte.weight[0]
        model.transformer.ln_f.bias += eos_boost * e / e.dot(e)
    return model


def find_stockfish_or_none() -> str | None:
    """Stockfish as users' runs find it (explicit path, STOCKFISH_PATH, PATH, the usual spots)."""
    from rookworld_rlvr.engine import StockfishNotFound, find_stockfish

    try:
        return find_stockfish()
    except StockfishNotFound:
        return None


@pytest.fixture(scope="session")
def stockfish_path() -> str:
    found = find_stockfish_or_none()
    if found is None:
        missing_tool("Stockfish", "run `make stockfish` (apt-get as root on Debian), or `sudo apt-get install "
                     "stockfish` / `brew install stockfish`, or point STOCKFISH_PATH at the binary")
    return found


@pytest.fixture(scope="session")
def chromium_path() -> str:
    import shutil

    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        missing_tool("Chromium (looked for chromium and chromium-browser on PATH)",
                     "run `make browser` (apt-get as root on Debian), or `sudo apt-get install chromium`")
    return found


@pytest.fixture
def torch_threads() -> Iterator[int]:
    """torch's thread count before the test, set back after it (for tests of `--threads`)."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def unchosen_float32_matmul() -> None:
    """torch's float32 matrix-product precision as a fresh process has it: nobody chose ("none")."""
    torch.backends.cuda.matmul.allow_tf32 = False  # the old setter first, so that its getter agrees with "none"
    torch.backends.cuda.matmul.fp32_precision = "none"
    torch.backends.mkldnn.matmul.fp32_precision = "none"
    torch.backends.fp32_precision = "none"


@pytest.fixture
def float32_matmul():
    """torch.backends.cuda.matmul with no float32 precision chosen yet, as in a fresh process; the choice the
    process had (TF32 once `resolve_device` met CUDA, or a test's IEEE) is set back after the test."""
    before = torch.backends.cuda.matmul.fp32_precision
    unchosen_float32_matmul()
    yield torch.backends.cuda.matmul
    unchosen_float32_matmul()
    if before != "none":
        torch.backends.cuda.matmul.allow_tf32 = before == "tf32"


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on shared cores: thread hand-offs cost more than they save."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def reference_lines() -> list[str]:
    if not REFERENCE.exists():
        pytest.fail(f"{REFERENCE} is missing: it ships with the repository")
    return REFERENCE.read_text().split("\n")


def random_transitions(n: int, seed: int = 0) -> list[env_task.EnvTruth]:
    """True A: transitions from random games, with the rare kinds forced in:
    checkmates, stalemates, other draws and illegal moves."""
    rng = random.Random(seed)
    out: list[env_task.EnvTruth] = []
    special = [
        ("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", "a1a8"),  # back-rank mate
        ("7k/5Q2/6K1/8/8/8/8/8 w - - 0 1", "f7f8"),  # not mate: check only? (kept as an ordinary/terminal case)
        ("k7/8/1Q6/8/8/8/8/7K w - - 0 1", "b6b7"),  # hmm: Qb7 is mate? recomputed by python-chess anyway
        ("7k/8/6Q1/8/8/8/8/7K w - - 0 1", "g6f7"),  # Qf7: stalemate
        ("8/8/8/8/8/8/k7/1n5K b - - 0 1", "a2b2"),
        ("8/8/8/4k3/8/8/3nK3/8 w - - 0 1", "e2d2"),  # KxN -> insufficient material draw
        ("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e5"),  # illegal
        ("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e4"),
        ("rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 3", "d4e3"),  # en passant
        ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1g1"),  # castling
        ("8/P7/8/8/8/8/8/k6K w - - 0 1", "a7a8q"),  # promotion
    ]
    for fen, mv in special:
        out.append(env_task.transition(fen, mv, ["e2e4", "e7e5"]))
    while len(out) < n:
        board = chess.Board()
        history: list[str] = []
        for _ in range(rng.randrange(10, 200)):
            if board.is_game_over():
                break
            fen = env_task.fen_of(board)
            if rng.random() < 0.05:
                bad = rng.choice(["a1a1", "e2e5", "h8h1", "b1b3", "d1d8"])
                out.append(env_task.transition(fen, bad, history[-9:]))
            move = rng.choice(list(board.legal_moves)).uci()
            out.append(env_task.transition(fen, move, history[-9:]))
            board.push_uci(move)
            history.append(move)
    return out[:n] if len(out) > n else out


UNREACHABLE_HUB = "http://127.0.0.1:9"  # the discard port: refused at once, as a machine without network refuses


@pytest.fixture
def answering_hub() -> Iterator[str]:
    """The endpoint of a Hub that answers and holds nothing (a local server: 404 to every HEAD and GET)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Hub(BaseHTTPRequestHandler):
        def answer(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET = answer

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Hub) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


def in_hub_cache(model_dir: Path, cache: Path, repo_id: str) -> None:
    """Lay `model_dir` into the Hub cache `cache` as huggingface_hub lays a download of `repo_id` there."""
    import shutil

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


SMALL_TINY_PRESET = {"n_layer": 2, "n_embd": 64, "n_head": 4}  # tiny_model_dir's shape


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random GPT-2 with the chess tokenizer, saved in Hugging Face format."""
    import torch
    from transformers import GPT2LMHeadModel

    from rookworld_rlvr.chess_tokenizers import build_chess_tokenizer
    from rookworld_rlvr.model import save_pretrained_atomic, tiny_config

    torch.manual_seed(0)
    tok = build_chess_tokenizer()
    cfg = tiny_config(len(tok), "tiny", n_positions=320)
    for name, value in SMALL_TINY_PRESET.items():
        setattr(cfg, name, value)
    model = GPT2LMHeadModel(cfg)
    out = tmp_path_factory.mktemp("tiny") / "model"
    save_pretrained_atomic(model, tok, out)
    return out


@pytest.fixture
def small_tiny_preset(monkeypatch):
    """A fresh SFT model's `tiny` preset at tiny_model_dir's shape (2 x 64) instead of the shipped 6 x 256: the
    tests that use it check what a run does (its steps, saves, resumes and logs), which the shape does not
    change, at about a twentieth of the arithmetic. test_model checks the presets' real shapes."""
    from rookworld_rlvr.model import load

    monkeypatch.setitem(load.PRESETS, "tiny", SMALL_TINY_PRESET)


@pytest.fixture(scope="session")
def small_data(tmp_path_factory, reference_lines):
    """Train/eval JSONL: P: from the reference file, A: from random games (real truths)."""
    from rookworld_rlvr.data.io import Sample, write_samples
    from rookworld_rlvr.tasks import policy as pol_task

    pol = [Sample("P", pol_task.parse_line(line)) for line in reference_lines[:80]]
    env = [Sample("A", t) for t in random_transitions(80, seed=7)]
    root = tmp_path_factory.mktemp("data")
    write_samples(root / "train.jsonl", pol[:60] + env[:60])
    write_samples(root / "eval.jsonl", pol[60:] + env[60:])
    for name, per_kind in HELD_OUT_SLICES.items():  # held_out_fields(root): the other held-out sets, a few rows each
        rows, kept = [json.loads(x) for x in gzip.open(REPO / "data" / f"{name}.jsonl.gz", "rt")], {}
        for row in rows:
            kept.setdefault(row.get("kind"), []).append(row)
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for k in kept.values() for r in k[:per_kind]))
    return root


# rows of each kind kept from the shipped held-out sets that a run evaluates whole beside eval_data (puzzles:
# mate1, tactic, check): the whole sets take most of a tiny test run's time, and minutes where bf16 is emulated
HELD_OUT_SLICES = {"puzzles_eval": 3, "strength": 6, "eval_histories": 6}


def as_options(fields: dict) -> list[str]:
    """Config fields as a command's options, `--the-field VALUE` (None as null, booleans as true or false)."""
    def text(value) -> str:
        return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return [a for k, v in fields.items() for a in (f"--{k.replace('_', '-')}", text(v))]


def held_out_fields(root: Path) -> dict[str, str]:
    """The config fields that point a run's other held-out sets at small_data's slices of them."""
    return {"puzzle_eval_data": str(root / "puzzles_eval.jsonl"), "strength_data": str(root / "strength.jsonl"),
            "history_eval_data": str(root / "eval_histories.jsonl")}


class BatchFault:
    """Counts the batches `model.completions` generates (`calls`) and raises KeyboardInterrupt (a Ctrl-C) as
    batch number `stop_at` starts (None: never)."""

    def __init__(self, monkeypatch) -> None:
        import rookworld_rlvr.model.completions as completions

        self.calls, self.stop_at, real = 0, None, completions.generate

        def generate(*args, **kwargs):
            self.calls += 1
            if self.calls == self.stop_at:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(completions, "generate", generate)


@pytest.fixture
def batch_fault(monkeypatch) -> BatchFault:
    return BatchFault(monkeypatch)
