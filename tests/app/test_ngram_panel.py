"""The live panels show a PLE model's n-gram rows (rows and bytes a token, hit rate, read amplification) from the
engine's own telemetry, and nothing of them before any token or for other models."""
from app.views.panels import LivePanels, _ngram_text
from engine import GenerationParams
from engine.format.repack import repack
from tests.families.qwen4_models import build_qwen4
from tests.streaming.sized import streaming_engine


def test_the_ram_cache_box_shows_the_ngram_rows_the_engine_reports(qtbot, tmp_path):
    model_dir = repack(build_qwen4(tmp_path / "hf"), tmp_path / "m", quant="fp8")
    eng = streaming_engine(model_dir, device="cpu", dtype="float32")
    try:
        panels = LivePanels(eng.telemetry)
        qtbot.addWidget(panels)
        panels.show()
        panels.refresh()
        assert not panels.ngram_label.isVisible()                       # no token looked up yet
        prompt = [(i * 37) % 390 + 3 for i in range(40)]
        list(eng.generate(prompt, GenerationParams(max_new_tokens=6, temperature=0.0)))
        panels.refresh()
        ngram = eng.telemetry()["ngram"]
    finally:
        eng.close()
    assert panels.ngram_label.isVisible()
    text = panels.ngram_label.text()
    assert ngram["rows_per_token"] > 0 and f"n-gram rows: {ngram['rows_per_token']:.1f} a token" in text
    assert f"hit rate {ngram['hit_rate'] * 100:.0f} %" in text
    assert f"read amplification {ngram['read_amplification']:.1f}x" in text
    assert not ngram["held"] and text.endswith("of hot rows")          # a RAM budget short of the whole model


def test_tables_held_in_ram_are_said_so_and_how_far_their_read_has_come():
    ngram = {"tokens": 4, "rows_per_token": 16.0, "bytes_per_token": 0, "hit_rate": 1.0, "read_amplification": 0.0,
             "cache_bytes": 3 << 30, "held": True, "held_read_bytes": 3 << 30}
    assert _ngram_text({"ngram": ngram}).endswith("3.00 GiB of tables held in RAM")
    ngram["held_read_bytes"] = 1 << 30                                   # the background read a third of the way
    assert _ngram_text({"ngram": ngram}).endswith("3.00 GiB of tables held in RAM (1.00 GiB read so far)")


def test_models_without_ngram_tables_show_no_ngram_line():
    assert _ngram_text({"ram_cache": {"hits": 3}}) is None
    assert _ngram_text({"ngram": {"tokens": 0}}) is None
