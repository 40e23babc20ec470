"""Tokenizers for chess text, built locally with the `tokenizers` library (no download needed):
one token per character, plus one per square inside UCI moves, plus FEN boards square by square.

All follow the GPT-2 conventions the RookWorld models use: one special token
`<|endoftext|>` with id 0 that is bos, eos and pad at once, left padding for
generation, and an exact `decode(encode(text)) == text` round trip (runs of
spaces matter: the P: layout pads columns with spaces).

Owns how chess text becomes tokens (the model package only sees a tokenizer). Imports no torch
(transformers' tokenizer classes do not load it) and nothing of the model or trainer.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<unk>"

# Every printable ASCII char (space .. ~) plus newline: covers FENs, UCI moves,
# evals, the P:/A: prefixes and multi-line files.
CHESS_CHARS: tuple[str, ...] = tuple(chr(c) for c in range(32, 127)) + ("\n",)


def with_conventions(tokenizer: Tokenizer, unk_token: str) -> PreTrainedTokenizerFast:
    """Wrap a raw `tokenizers.Tokenizer` with the shared special-token conventions."""
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=unk_token,
        padding_side="left",
        # The default clean-up would rewrite " ." / " ," etc. and break the round trip.
        clean_up_tokenization_spaces=False,
    )
    assert wrapped.eos_token_id == 0, "eos must be id 0"
    return wrapped


def build_chess_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: one token per character, ids stable and tiny (98).

    Vocabulary: `<|endoftext|>` (0), `<unk>` (1), printable ASCII space..~ (2..96), "\\n" (97).
    A literal `<|endoftext|>` inside text is recognised as the special token.
    """
    vocab = {EOS_TOKEN: 0, UNK_TOKEN: 1}
    for ch in CHESS_CHARS:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Split into single characters ([\s\S] also matches "\n", unlike ".").
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate tokens as-is: exact round trip
    tok.add_special_tokens([EOS_TOKEN, UNK_TOKEN])
    return with_conventions(tok, UNK_TOKEN)


SQUARES: tuple[str, ...] = tuple(f + r for r in "12345678" for f in "abcdefgh")
# A UCI move is a whole word between spaces/"+" (M:, B:, the A: move and history). A FEN board
# is one word with "/" in it, so its bishop-and-count pairs like "b1" never match; squares are
# split off only inside move words, where they mean squares.
_MOVE_WORD = r"(?<![^\s+])[a-h][1-8][a-h][1-8][qrbn]?(?![^\s+])"
_MOVE_SQUARES = r"^[a-h][1-8]|(?<=^[a-h][1-8])[a-h][1-8]|[\s\S]"


def build_square_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer plus one token per square (162 tokens), used inside UCI moves:
    `e2e4` is 2 tokens, `e7e8q` 3. Any text still round-trips exactly (everything else, FENs
    included, stays one token per character). About 10% fewer tokens per sample."""
    vocab = {EOS_TOKEN: 0, UNK_TOKEN: 1}
    for tok_str in CHESS_CHARS + SQUARES:
        vocab[tok_str] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_MOVE_WORD), behavior="isolated"),
        pre_tokenizers.Split(Regex(_MOVE_SQUARES), behavior="isolated"),
    ])
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([EOS_TOKEN, UNK_TOKEN])
    return with_conventions(tok, UNK_TOKEN)


EMPTY_SQUARE = "_"
# A digit of a FEN board: followed by more board characters up to a "/" (ranks 8..2) or by the
# side to move (rank 1). Move words like "b2b4" never match: their digit is followed by a file
# letter or a space and another move, never by " w " / " b ".
_BOARD_DIGIT = r"(?=[pnbrqkPNBRQK1-8_]*(?:/|\s[wb]\s))"


def build_board_tokenizer() -> PreTrainedTokenizerFast:
    """The square tokenizer, with every FEN board written square by square inside the model.

    The normalizer expands each run of n empty squares into n `_` tokens, so a board is always
    71 tokens (64 squares and 7 `/`) and every square sits at a fixed offset: a small model no
    longer counts digits to find a piece ("Grandmaster-level chess without search", Ruoss et al.
    2024). The decoder folds runs of `_` back into digits, so `decode(encode(text)) == text` for
    every FEN: the text users and RookWorld-LM see keeps the standard notation. Decode whole
    completions (as `generate` does): a run split over two decode calls folds into two digits.
    """
    vocab = {EOS_TOKEN: 0, UNK_TOKEN: 1}
    for tok_str in CHESS_CHARS + SQUARES:
        vocab[tok_str] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # one rule per digit; later rules see earlier expansions, hence "_" in the look-ahead class
    tok.normalizer = normalizers.Sequence(
        [normalizers.Replace(Regex(f"{n}{_BOARD_DIGIT}"), EMPTY_SQUARE * n) for n in range(1, 9)])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_MOVE_WORD), behavior="isolated"),
        pre_tokenizers.Split(Regex(_MOVE_SQUARES), behavior="isolated"),
    ])
    # longest run first: "________" is 8, never 4 + 4
    tok.decoder = decoders.Sequence(
        [decoders.Fuse()] + [decoders.Replace(EMPTY_SQUARE * n, str(n)) for n in range(8, 0, -1)])
    tok.add_special_tokens([EOS_TOKEN, UNK_TOKEN])
    return with_conventions(tok, UNK_TOKEN)


TOKENIZERS = {"char": build_chess_tokenizer, "square": build_square_tokenizer, "board": build_board_tokenizer}
