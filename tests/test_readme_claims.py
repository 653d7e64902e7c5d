"""README's numbers and examples agree with what made them: the speed table, its RAM floor, hub ids."""
import re
from pathlib import Path

import pytest

from bench import speed_table as expect

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_speed_table_is_the_commands_output_and_starts_at_the_ram_it_asks_for():
    assert expect.table() in README                                  # computed, not edited by hand
    least_ram_gb = int(re.search(r"\*\*RAM\*\*: (\d+) GB at least", README).group(1))
    assert min(pc.ram_gb for pc in expect.PCS) == least_ram_gb


def test_the_measured_figures_the_table_uses_are_benchmarks_rows():
    rows = [line for line in (ROOT / "BENCHMARKS.md").read_text().splitlines() if line.startswith("| ")]
    for measured in expect.MEASURED.values():
        row = next(line for line in rows if line.startswith(f"| {measured.run}"))
        cells = row.split(" | ")
        assert cells[1] == measured.machine, row
        assert f"{measured.tok_s:g}" in cells[2] and f"{measured.efficiency:.2f}" in cells[3], row


def test_a_row_by_hand_gpt_oss_20b_on_the_24_gb_pc():
    """Its 10.2 GB of mxfp4 experts all sit in VRAM: no reads or copies. The GPU reads the int8 dense weights but the
    embedding (1,797,824,064 - 2,547,264 exact params at 1 byte, those at 2, less 579,133,440 embedding bytes) and
    24 x 4 blocks of 13,254,656 bytes: 2.494 GB at 1000 GB/s = 2.494 ms; gpt-oss's run left (1 - 0.28) / (105.93
    tok/s x 12 layers) = 0.566 ms a layer unexplained, x 24 layers = 13.59 ms: 16.09 ms a token."""
    from engine.plan.estimate import estimate
    name, quant, config = next(m for m in expect.models() if m[0] == "gpt-oss-20b")
    pc = expect.PCS[-1]
    est = estimate(config, 0, expect.machine(pc), quant, dense_quant="int8")
    gpu_bytes = (1_797_824_064 - 2_547_264) + 2 * 2_547_264 - 579_133_440 + 24 * 4 * 13_254_656
    by_hand = 1 / (gpu_bytes / 1000e9 + 24 * (1 - 0.28) / (105.93 * 12))
    assert by_hand == pytest.approx(62.16, abs=0.01)
    assert expect.expected_tok_s(est, expect.MEASURED["gpt_oss"]) == pytest.approx(by_hand)
    assert expect.cell(pc, config, quant) == "62 tok/s (int8 dense)"


def test_test_hub_repo_ids_are_said_to_be_the_test_hubs():
    for line in README.splitlines():
        if re.search(r"sluice download sluice-test/", line):
            assert "test hub" in line, line
