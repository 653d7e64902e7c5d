"""The incremental detokenizer never emits half a character and holds back stop strings."""
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
