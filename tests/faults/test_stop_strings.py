"""Stop strings are matched in time linear in the text, however long they are, and cut exactly where a
brute-force search cuts."""
import random
import time

from engine.detokenize import IncrementalDetokenizer


class CharTokenizer:
    """One token per character (id = code point): the detokenizer's stop logic without a vocabulary."""

    def decode(self, ids, **_):
        return "".join(map(chr, ids))


def _stream(text: str, stop: list[str]) -> tuple[list[str], bool]:
    detok = IncrementalDetokenizer(CharTokenizer(), stop)
    pieces = []
    for char in text:
        pieces.append(detok.push(ord(char)))
        if detok.stopped:
            break
    pieces.append(detok.flush())
    return pieces, detok.stopped


def _reference(text: str, stop: list[str]) -> tuple[str, bool]:
    """The text up to the stop string that ends first (the longest one where several end together)."""
    for end in range(1, len(text) + 1):
        ended = [s for s in stop if text[:end].endswith(s)]
        if ended:
            return text[:end - max(map(len, ended))], True
    return text, False


def test_cuts_where_a_brute_force_search_cuts():
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 30)))       # two letters: many overlaps
        stop = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 3))]
        pieces, stopped = _stream(text, stop)
        expected, expected_stopped = _reference(text, stop)
        assert ("".join(pieces), stopped) == (expected, expected_stopped), (text, stop)
        shown = ""
        for piece in pieces:
            shown += piece
            assert expected.startswith(shown)        # never shows text that a stop string later takes back


def test_a_three_million_character_stop_string_costs_linear_time():
    long_stop = "ab" * 1_500_000                     # the longest a 4 MiB request body can carry, roughly
    text = "ab" * 5_000 + "c" + "x" * 5_000          # follows the stop string for 10,000 characters, then leaves it
    started = time.perf_counter()
    pieces, stopped = _stream(text, [long_stop, "c" * 2_000_000])
    elapsed_s = time.perf_counter() - started
    assert not stopped and "".join(pieces) == text
    assert elapsed_s < 2.0, f"{elapsed_s:.1f} s for 20,000 characters"


def test_a_long_stop_string_that_does_appear_stops_generation():
    stop = "na" * 20_000 + "!"
    pieces, stopped = _stream("ba" + "na" * 30_000 + "!" + " and more", [stop])
    assert stopped and "".join(pieces) == "ba" + "na" * 10_000
