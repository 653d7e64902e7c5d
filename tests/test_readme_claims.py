"""README's numbers and examples agree with what made them: the fit table, its RAM floor, hub ids."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_fit_table_is_the_scripts_output_and_starts_at_the_ram_it_asks_for():
    table = subprocess.run([sys.executable, str(ROOT / "docs" / "fit_table.py")], capture_output=True, text=True,
                           check=True).stdout
    assert table in README                                           # computed, not edited by hand
    least_ram_gb = int(re.search(r"\*\*RAM\*\*: (\d+) GB at least", README).group(1))
    ram_rows = [int(gb) for gb in re.findall(r"^\| \d+ GB GPU, (\d+) GB RAM", table, re.MULTILINE)]
    assert min(ram_rows) == least_ram_gb, (least_ram_gb, ram_rows)


def test_test_hub_repo_ids_are_said_to_be_the_test_hubs():
    for line in README.splitlines():
        if re.search(r"sluice download sluice-test/", line):
            assert "test hub" in line, line
