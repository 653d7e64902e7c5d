"""Family tests run tiny models: one intra-op thread. With two threads on a shared 2-core machine the
OpenMP barriers of tiny ops wait on busy cores (measured: a 150-token qwen3_5_moe generation 31 s
with 2 threads under load, 0.9 s with 1)."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
