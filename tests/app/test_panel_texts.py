"""The live panels' memory line, on a GPU's snapshot (the driver's figure beside the budget)."""
from app.views.panels import _memory_text


def test_memory_line_names_what_the_engine_holds_and_the_driver_view_against_the_budget():
    snapshot = {"process": {"non_cache_anon_bytes": 950 << 20},
                "vram": {"driver_bytes": int(3.66 * 2**30), "budget_bytes": int(3.73 * 2**30)}}
    assert _memory_text(snapshot) == "950.00 MiB besides the cache · VRAM 3.66 GiB (driver) of a 3.73 GiB budget"
    assert _memory_text({"process": {"non_cache_anon_bytes": 2 << 30}, "vram": {}}) == "2.00 GiB besides the cache"
    assert _memory_text({}) == "—"                                                  # before any model is loaded
