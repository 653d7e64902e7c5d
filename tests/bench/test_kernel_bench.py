"""The kernels stage's pieces that need no GPU: the fp4 sweep's configs, the table, and the offline
SASS count's loop finder (on a hand-written listing)."""
from bench.ptxas_decode import hottest_loop
from bench.stages.kernels import print_table, sweep
from kernels.moe_decode import _check_config, default_config

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0020*/                   FFMA R3, R2, R2, R3 ;
        /*0030*/                   FFMA R3, R2, R2, R3 ;
        /*0040*/              @!P0 BRA 0x10 ;
        /*0050*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0060*/                   FFMA R3, R2, R2, R3 ;
        /*0070*/              @!P0 BRA 0x60 ;
        /*0080*/              @!P1 BRA 0x50 ;
        /*0090*/                   EXIT ;
        /*00a0*/                   BRA 0xa0;
"""


def test_hottest_loop_is_the_longest_loop_without_an_inner_one():
    assert hottest_loop(SASS) == 4          # 0x10..0x40; 0x50..0x80 holds the loop 0x60..0x70
    assert hottest_loop("        /*0000*/                   EXIT ;") == 0


def test_fp4_sweeps_try_each_config_once_and_only_valid_ones():
    for fmt in ("nvfp4", "mxfp4"):
        configs = sweep(fmt)
        assert configs[0] == default_config(fmt) and len(set(configs)) == len(configs)
        for cfg in configs:
            _check_config(cfg, fmt)


def test_table_gives_each_rows_best_time_share_and_config(capsys):
    best = default_config("mxfp4").__dict__
    row = {"model": "gpt-oss-120b", "fmt": "mxfp4", "graph_us": 51.3, "graph_frac_of_hbm_copy": 0.34,
           "best_config": best}
    print_table([row, row | {"fmt": "bf16"}])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2] == "| gpt-oss-120b | mxfp4 | 51.3 us | 34% | 8/8/512/w2/split |"
    assert lines[-1].startswith("| gpt-oss-120b | bf16 | 51.3 us | 34% |")
