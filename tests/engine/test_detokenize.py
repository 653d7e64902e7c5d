"""The incremental detokenizer never emits half a character and holds back stop strings."""
import random

from engine.tools.demo import train_tiny_tokenizer
from engine.detokenize import IncrementalDetokenizer


def test_multibyte_characters_are_never_split(tmp_path):
    tok = train_tiny_tokenizer(tmp_path)
    text = "naïve 🙂 café 日本語 🚀✨ über"
    ids = tok(text)["input_ids"]
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert len([p for p in pieces if p]) > 3          # it really streams, not all at the end


def test_stop_string_spanning_tokens_is_cut_and_held_back(tmp_path):
    tok = train_tiny_tokenizer(tmp_path)
    text = "the quick brown fox jumps"
    detok = IncrementalDetokenizer(tok, stop=["n fox"])
    out = ""
    for i in tok(text)["input_ids"]:
        out += detok.push(i)
        assert "n fo" not in out                       # a possible stop prefix is never shown early
        if detok.stopped:
            break
    assert detok.stopped and out == "the quick brow"


def test_pieces_add_up_to_the_decode_even_when_the_last_character_is_unfinished(tmp_path):
    tok = train_tiny_tokenizer(tmp_path)
    cut_emoji = [tok.convert_tokens_to_ids(c) for c in ("h", "i", "ð", "Ł")]   # byte-level 'hi' + 2 of 🙂's 4 bytes
    rng = random.Random(0)
    runs = [cut_emoji] + [[rng.randrange(3, len(tok)) for _ in range(12)] for _ in range(200)]   # random bytes too
    for ids in runs:
        detok = IncrementalDetokenizer(tok)
        pieces = [detok.push(i) for i in ids] + [detok.flush()]
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_byte_fallback_characters_stream_whole_and_add_up_to_the_text():
    tok = _byte_fallback_tokenizer()
    text = "über ключ 🙂 日本語"
    ids = tok(text)["input_ids"]
    assert sum(t.startswith("<0x") for t in tok.convert_ids_to_tokens(ids)) >= 10      # really split into bytes
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    assert {"к", "л", "ю", "ч", "🙂"} <= set(pieces)               # each character the moment its last byte arrives


def _byte_fallback_tokenizer():
    """A Llama-style tokenizer: '▁' for spaces, and the 256 <0xXX> byte tokens for characters it lacks."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "</s>": 1, **{f"<0x{b:02X}>": 2 + b for b in range(256)}}
    for piece in ("▁", *"abcdeüfghijklmnopqrstuvwxyz", "▁ü", "▁üb", "er"):
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "ü"), ("▁ü", "b"), ("e", "r")], byte_fallback=True,
                               unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")
