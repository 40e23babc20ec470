"""What `rookworld sft` learns from: token rows with their likelihood targets and unlikelihood bans.

A row is the token ids of one sample (or of the model's own answer), where its likelihood targets
start, which tokens are banned where (the unlikelihood of repeating an M: move), and for a P:
sample its true candidates best first, so the model's own repeated lists can be corrected
(`own_repeat_rows`). Owns the rows, their batches and the task mix of a batch (`draw_batch`); `sft`
owns the loop. Imports torch inside functions only; the chess it knows is the P: text's `M:` list,
read as words.
"""

from __future__ import annotations

import bisect
import multiprocessing as mp
import re
from typing import TYPE_CHECKING, NamedTuple

from rookworld_rlvr.interrupt import chunk_size, forked_pool, pool_size

if TYPE_CHECKING:
    import random

    import torch


class Row(NamedTuple):
    ids: list[int]
    prompt_len: int  # likelihood targets follow it (loss_on completion); -1: no likelihood targets
    bans: tuple[tuple[int, int], ...] = ()  # (position, token id) the unlikelihood pushes down
    moves: tuple[str, ...] = ()  # P: the true candidates, best first
    learn_from: int | None = None  # own rows: the likelihood targets start here, whatever loss_on says
    weight: float = 1.0  # of each likelihood target token against a data token
    # (position, token ids) where a P: move's token must be one that continues a legal move (legal_sets)
    legal: tuple[tuple[int, tuple[int, ...]], ...] = ()


def encode(tokenizer, samples, layout: str, order: str = "given", legal: bool = False) -> list[Row]:
    """Rows of samples, ids ending in EOS. Prompt and completion are tokenized apart, as at
    generation. The bans are (position, token) pairs where that token would repeat an M: move;
    with `legal`, P: rows also carry their legal sets (see legal_sets)."""
    from rookworld_rlvr.tasks.policy import PolicyTruth, ranked

    pairs = [s.render(layout, order) for s in samples]
    if not pairs:  # the tokenizer cannot take an empty batch
        return []
    prompts, _ = _tokenize(tokenizer, [p for p, _ in pairs])
    completions, offset_lists = _tokenize(tokenizer, [c for _, c in pairs])
    eos = tokenizer.eos_token_id
    spelled: dict[str, tuple[int, ...]] = {}  # UCI move -> its tokens (a move tokenizes alike anywhere)
    rows = []
    for s, (_, text), p, c, offsets in zip(samples, pairs, prompts, completions, offset_lists):
        bans = tuple((len(p) + k, tok) for k, tok in repeat_bans(text, c, offsets))
        moves = ranked(s.truth)[0] if isinstance(s.truth, PolicyTruth) else ()
        sets = ()
        if legal and isinstance(s.truth, PolicyTruth):
            sets = tuple((len(p) + k, toks) for k, toks in legal_sets(s.truth.fen, text, c, offsets, tokenizer, spelled))
        rows.append(Row(p + c + [eos], len(p), bans, moves, legal=sets))
    return rows


def _tokenize(tokenizer, texts: list[str]) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
    """Token ids and character offsets of each text, without special tokens: from the Rust tokenizer itself where
    there is one (the same ids and offsets as calling the tokenizer, without converting each encoding in Python;
    with _words' bisection, encode() went from 263 to 247 us a row), else from the tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        encodings = backend.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encodings], [e.offsets for e in encodings]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], enc["offset_mapping"]


PARALLEL_ROWS = 50_000  # from this many samples on, encode_many encodes in several processes
_JOB: tuple | None = None  # (tokenizer, samples, layout, order, legal): set before the fork, read by the workers


def encode_many(tokenizer, samples, layout: str, order: str = "given", legal: bool = False,
                workers: int | None = None, min_rows: int = PARALLEL_ROWS) -> list[Row]:
    """encode() of a large training set in `workers` forked processes (default: `interrupt.pool_size()`, the
    cores it may use, at most 16), from `min_rows` samples on: the same rows in the same order. Tokenizing and
    finding the bans cost ~0.2 ms a row in one process: a GPU base's 1.5M rows took minutes of its GPU time
    before the first step."""
    global _JOB
    workers = workers or pool_size()
    if workers < 2 or len(samples) < max(min_rows, 2) or "fork" not in mp.get_all_start_methods():
        return encode(tokenizer, samples, layout, order, legal)
    size = chunk_size(len(samples), workers)
    _JOB = (tokenizer, samples, layout, order, legal)  # the workers inherit it: no sample is pickled to them
    try:  # fork: the workers run the tokenizer and python alone, never torch (as read_samples' workers)
        with forked_pool(workers) as pool:
            parts = pool.map(_encode_range, [(i, i + size) for i in range(0, len(samples), size)])
    finally:
        _JOB = None
    return [row for part in parts for row in part]


def _encode_range(bounds: tuple[int, int]) -> list[Row]:
    tokenizer, samples, layout, order, legal = _JOB
    return encode(tokenizer, samples[bounds[0]:bounds[1]], layout, order, legal)


def _words(text: str, offsets: list[tuple[int, int]], start: int, stop: int) -> list[tuple[str, list[int]]]:
    """The words of text[start:stop], each with the indices of the tokens that spell it."""
    out = []
    firsts = [x for x, _ in offsets]  # in text order: a word's tokens follow the first that starts in it
    for m in re.finditer(r"\S+", text[start:stop]):
        a, b = start + m.start(), start + m.end()
        k, spell = bisect.bisect_left(firsts, a), []
        while k < len(offsets) and offsets[k][0] < b:
            if b >= offsets[k][1] > offsets[k][0]:
                spell.append(k)
            k += 1
        out.append((m.group(), spell))
    return out


def legal_sets(fen: str, text: str, ids: list[int], offsets: list[tuple[int, int]], tokenizer,
               spelled: dict[str, tuple[int, ...]] | None = None) -> list[tuple[int, tuple[int, ...]]]:
    """Where a P: target writes a move, the tokens that would keep it a legal move not yet listed.

    For each token of each M: move (and of B:'s move): (token index, the ids of every token that
    continues some legal move from the same prefix; in M:, moves listed before it excluded). The
    set likelihood -log sum p(set) (legality_loss) then teaches the rules at every move, not only
    the one move the target wrote: the likelihood alone left a third of the greedy best moves
    illegal. A move whose tokens are not its own spelling (a tokenizer that merges across words)
    gets no set."""
    from rookworld_rlvr.tasks.strength import legal_moves

    if "M:" not in text or "E:" not in text:
        return []
    spelled = {} if spelled is None else spelled

    def spell(uci: str) -> tuple[int, ...]:
        if uci not in spelled:
            spelled[uci] = tuple(tokenizer(uci, add_special_tokens=False)["input_ids"])
        return spelled[uci]

    legal = {m: spell(m) for m in legal_moves(fen)}  # empty for an unreadable FEN
    m_at, e_at = text.index("M:") + 2, text.index("E:")
    words = [(w, ks, True) for w, ks in _words(text, offsets, m_at, e_at)]
    if "B:" in text:
        b_at = text.index("B:") + 2
        words += [(w, ks, False) for w, ks in _words(text, offsets, b_at, len(text))[:1]]
    out, listed = [], set()
    for word, ks, in_m in words:
        seq = tuple(ids[k] for k in ks)
        if word not in legal or legal[word] != seq or (in_m and word in listed):
            return out  # an illegal or oddly spelled target: nothing to say from here on
        pool = [t for m, t in legal.items() if not (in_m and m in listed)]
        for j, k in enumerate(ks):
            out.append((k, tuple(sorted({t[j] for t in pool if len(t) > j and t[:j] == seq[:j]}))))
        if in_m:
            listed.add(word)
    return out


def repeat_bans(text: str, ids: list[int], offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Where a P: target's M: list teaches "never write a move twice": (token index, token id) pairs.

    A later move that shares all but the last token of an earlier one (the same from-square, say)
    must not end with that earlier move's last token; the unlikelihood loss pushes that token's
    probability down there. A model trained on lists alone still repeats its top move under greedy
    decoding: nothing in the likelihood says the second slot must differ from the first."""
    if "M:" not in text or "E:" not in text:
        return []
    moves = [ks for _, ks in _words(text, offsets, text.index("M:") + 2, text.index("E:"))]
    bans = []
    for i, cur in enumerate(moves):
        for prev in moves[:i]:
            n = len(prev) - 1
            if n < len(cur) and [ids[k] for k in cur[:n]] == [ids[k] for k in prev[:n]] and ids[cur[n]] != ids[prev[n]]:
                bans.append((cur[n], ids[prev[n]]))
    return bans


def _field(row, name: str, default):
    """A Row field, or its default for the plain (ids, prompt length) tuples tests build."""
    return getattr(row, name, default)


def make_batch(rows: list, pad_id: int, loss_on: str):
    """Right-padded batch; labels -100 on padding (and on the prompt for completion-only loss)."""
    import torch

    from rookworld_rlvr.model.padding import pad

    input_ids, mask = pad([r[0] for r in rows], pad_id, "right")
    width = input_ids.shape[1]

    def start(r) -> int:  # the first column with a likelihood target
        if _field(r, "learn_from", None) is not None:
            return r.learn_from
        return width if r[1] < 0 else r[1] if loss_on == "completion" else 1

    starts = torch.tensor([start(r) for r in rows])
    learned = (torch.arange(width) >= starts[:, None]) & mask.bool()
    return input_ids, mask, torch.where(learned, input_ids, torch.full_like(input_ids, -100))


def token_weights(rows: list, labels: "torch.Tensor") -> "torch.Tensor":
    """[N, W] weight of each label (the row's weight where it has a target, else 0)."""
    import torch

    w = torch.tensor([float(_field(r, "weight", 1.0)) for r in rows])[:, None]
    return (labels != -100).float() * w


class MicroBatch(NamedTuple):
    """One micro-batch's tensors, all made on the host: a step then moves them to its device without waiting
    for it (`on_device`), and the next step's can be made while the device runs this one."""
    rows: list
    input_ids: "torch.Tensor"  # right-padded
    mask: "torch.Tensor"
    labels: "torch.Tensor"
    weights: "torch.Tensor"  # token_weights
    bans: tuple  # ban_index: (row, position, token)
    legal: tuple  # legal_index: (row, position, set, token)


def micro_batches(rows: list, pad_id: int, loss_on: str) -> list[MicroBatch]:
    """A step's rows as two micro-batches, the shorter half and the longer (see sft._accumulate)."""
    rows = sorted(rows, key=lambda r: len(r[0]))
    half = len(rows) // 2
    out = []
    for bucket in (b for b in (rows[:half], rows[half:]) if b):
        input_ids, mask, labels = make_batch(bucket, pad_id, loss_on)
        out.append(MicroBatch(bucket, input_ids, mask, labels, token_weights(bucket, labels), ban_index(bucket),
                              legal_index(bucket)))
    return out


def on_device(x: "torch.Tensor", device) -> "torch.Tensor":
    """`x` on `device`: from pinned memory and without waiting where it is a GPU (a plain copy waits for
    every kernel queued before it, so the host could not run ahead of the device)."""
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def ban_index(rows: list) -> tuple:
    """The rows' repeat bans as index tensors (row, position of the logits, banned token); () where none."""
    import torch

    where = [(i, pos - 1, tok) for i, r in enumerate(rows) for pos, tok in (r[2] if len(r) > 2 else ())]
    return tuple(torch.tensor(x) for x in zip(*where)) if where else ()


def unlikelihood(logits, rows_or_index) -> "torch.Tensor":
    """Sum over the rows' repeat bans (or their ban_index) of -log(1 - p(banned token)) (Welleck et al. 2019)."""
    import torch

    index = rows_or_index if isinstance(rows_or_index, tuple) else ban_index(rows_or_index)
    if not index:
        return logits.new_zeros(())
    i, t, tok = (on_device(x, logits.device) for x in index)
    p = torch.softmax(logits[i, t].float(), dim=-1).gather(1, tok[:, None]).squeeze(1)
    return -torch.log1p(-p.clamp(max=1 - 1e-6)).sum()


def legal_index(rows: list) -> tuple:
    """The rows' legal sets as index tensors: (row, position of the logits) per set, and (set, token) per
    allowed token; () where none. Sparse, so a 50,257-token vocabulary costs no host memory per set."""
    import torch

    where = [(i, pos - 1, toks) for i, r in enumerate(rows) for pos, toks in _field(r, "legal", ())]
    if not where:
        return ()
    at = [(n, tok) for n, (_, _, toks) in enumerate(where) for tok in toks]
    return (torch.tensor([w[0] for w in where]), torch.tensor([w[1] for w in where]),
            torch.tensor([n for n, _ in at], dtype=torch.long), torch.tensor([tok for _, tok in at], dtype=torch.long))


def legality_loss(logits, rows_or_index) -> "torch.Tensor":
    """Sum over the rows' legal sets (or their legal_index) of -log sum over the set of p(token): the
    probability that the token at a move's place continues a legal move (not yet listed). Zero where the
    model already puts all its mass on legal continuations; the likelihood then chooses among them."""
    import torch

    index = rows_or_index if isinstance(rows_or_index, tuple) else legal_index(rows_or_index)
    if not index:
        return logits.new_zeros(())
    i, t, n, tok = (on_device(x, logits.device) for x in index)
    allowed = torch.zeros(len(i), logits.shape[-1], dtype=torch.bool, device=logits.device)
    # one indexed write, not one per set; its value already on the device (`allowed[n, tok] = True` copies a host
    # scalar there first, which waits for the device: found by the CUDA test of an SFT step)
    allowed.index_put_((n, tok), torch.ones((), dtype=torch.bool, device=logits.device))
    z = logits[i, t].float()
    return (torch.logsumexp(z, -1) - torch.logsumexp(z.masked_fill(~allowed, float("-inf")), -1)).sum()


def first_repeat(text: str) -> tuple[int, int] | None:
    """(start, end) of the first M: move that an answer writes a second time, or None.
    Only the M: list counts (the words before E:): B: names one of its moves by design."""
    if not text.startswith("M:"):
        return None
    stop = text.find("E:")
    seen = set()
    for m in re.finditer(r"\S+", text[2: stop if stop >= 0 else len(text)]):
        if m.group() in seen:
            return 2 + m.start(), 2 + m.end()
        seen.add(m.group())
    return None


def own_repeat_rows(model, tokenizer, rows: list, max_new_tokens: int = 30,
                    target_weight: float = 0.0) -> list[Row]:
    """Rows that teach the model not to repeat a move where it does repeat one.

    The prompts of P: `rows` are answered greedily by the model itself. Each answer whose M: list
    writes a move again gives a row of its own prefix through the repeat, with no likelihood target
    and a ban on the repeated move's last token. With `target_weight` > 0 it also gives the
    correction (DAgger, Ross et al. 2011): its own prefix before the repeat, then the best true
    candidate it has not listed yet (or `E:` when it listed them all), learned at that weight. The
    likelihood sees only true lists, where nothing repeats, so without these rows greedy decoding
    keeps writing the top move five times: a ban alone says what not to write, the target what to."""
    from rookworld_rlvr.model import generate

    if not rows:
        return []
    prompts = [tokenizer.decode(r[0][: r[1]]) for r in rows]
    texts = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, greedy=True).texts
    out = []
    for r, text in zip(rows, texts):
        ids, n = r[0], r[1]
        span = first_repeat(text)
        if span is None:
            continue
        enc = tokenizer(text[: span[1]], add_special_tokens=False)["input_ids"]
        # the repeated move's last token, in the context of the model's own list before it
        out.append(Row(ids[:n] + enc, -1, ((n + len(enc) - 1, enc[-1]),)))
        if target_weight > 0 and _field(r, "moves", ()):
            listed = set(text[2: span[0]].split())
            target = next((m for m in r.moves if m not in listed), "E:")
            prefix = tokenizer(text[: span[0]], add_special_tokens=False)["input_ids"]
            whole = tokenizer(text[: span[0]] + target, add_special_tokens=False)["input_ids"]
            if whole[: len(prefix)] == prefix:  # the prefix tokenizes alike with the target after it
                out.append(Row(ids[:n] + whole, -1, (), (), n + len(prefix), target_weight))
    return out


def draw_batch(rng: random.Random, by_task: dict[str, list], batch_size: int, env_share: float) -> tuple[list, list]:
    """One batch of training rows: each slot is an `A:` row with probability `env_share`, else a `P:` row
    (drawn with replacement). With no `A:` rows every slot takes a `P:` row; with no `P:` rows the batch holds
    only the `A:` slots."""
    n_env = sum(rng.random() < env_share for _ in range(batch_size))
    env_rows = rng.choices(by_task["A"], k=n_env) if by_task["A"] and n_env else []
    pol_rows = rng.choices(by_task["P"], k=batch_size - len(env_rows)) if by_task["P"] else []
    return env_rows, pol_rows
