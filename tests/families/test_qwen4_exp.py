"""qwen4_exp through the user's path (repack -> engine.load -> generate), token-exact with transformers (float32,
greedy, streaming forced), from the text-only and the multimodal checkpoint; a prompt that crosses EOS tokens
(the n-gram history resets) and spans three DeltaNet prefill chunks; the n-gram rows read from ngram.bin; the CUDA
graphs' decode step run on the CPU."""
import numpy as np
import pytest
import torch
from safetensors import safe_open

import engine
from engine import GenerationParams, SluiceError
from engine.format.modeldir import open_model_dir
from engine.format.ngram import PAGE, read_index
from engine.format.repack import repack
from engine.model.qwen4.ngram_hash import NgramHasher
from engine.runtime.ngram import held_bytes
from tests.engine.reference import load_reference, reference_greedy
from tests.families.qwen4_models import EOS, TEXT, build_qwen4
from tests.streaming.sized import streaming_engine, token_ids

PROMPT_IDS = [(i * 37) % 390 + 3 for i in range(150)]      # 150 tokens: DeltaNet chunks of 64, 64 and 22
for _at in (40, 41, 97):                                     # EOS twice in a row, then once more
    PROMPT_IDS[_at] = EOS
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return build_qwen4(tmp_path_factory.mktemp("qwen4_exp_text") / "hf")


@pytest.fixture(scope="module")
def multimodal_dir(tmp_path_factory):
    return build_qwen4(tmp_path_factory.mktemp("qwen4_exp") / "hf", multimodal=True, seed=1, with_tokenizer=True)


def _hasher() -> NgramHasher:
    return NgramHasher(TEXT["vocab_size"], TEXT["ngram_size"], TEXT["heads_per_ngram"], TEXT["ngram_vocab_size_base"],
                       TEXT["seed"], EOS, len(TEXT["ple_layer_ids"]))


@pytest.mark.parametrize("quant", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("checkpoint", ["text", "multimodal"])
def test_greedy_tokens_match_transformers(checkpoint, quant, request, tmp_path):
    hf_dir = request.getfixturevalue(f"{checkpoint}_dir")
    model_dir = repack(hf_dir, tmp_path / "m", quant=quant)
    with safe_open(str(model_dir / "dense.safetensors"), "pt") as f:
        names = list(f.keys())
    assert not any("ngram_embedding" in n or "visual" in n or "language_model" in n for n in names)
    eng = streaming_engine(model_dir, device="cpu", dtype="float32")
    ours = token_ids(eng, PROMPT_IDS, NEW_TOKENS)
    assert ours == reference_greedy(load_reference(hf_dir, quant), PROMPT_IDS, NEW_TOKENS)
    assert token_ids(eng, PROMPT_IDS, NEW_TOKENS) == ours        # a new conversation: fresh states and history
    tel = eng.telemetry()
    assert tel["ram_cache"]["capacity_bytes"] < eng.model.expert_bytes_total
    assert tel["ram_cache"]["misses"] > 0 and tel["ram_cache"]["evictions"] > 0
    ngram = tel["ngram"]
    assert ngram["hits"] > 0 and ngram["misses"] > 0 and ngram["read_amplification"] >= 1.0
    assert 0 < ngram["cache_bytes"] < tel["ram_cache"]["capacity_bytes"] + ngram["cache_bytes"]
    eng.close()


def test_the_graph_shaped_decode_step_follows_transformers_across_blocks_and_an_eos(text_dir, tmp_path):
    """The CUDA graphs' step, run eagerly on the CPU: the state static at full size and no host-known position (QSA
    ranks every block row, each block's pooled key committed by the step that completes it), the n-gram rows copied
    into static inputs before each layer. Tokens forced through an EOS (the history resets mid-decode) and five
    block completions: every step's logits are transformers' over the whole sequence."""
    from engine.model.state import ModelState
    from engine.runtime.decode_step import DecodeStep

    eng = streaming_engine(repack(text_dir, tmp_path / "m"), device="cpu", dtype="float32")
    runner = eng.runner
    runner.state = ModelState(runner.model.state_specs(), 96, torch.float32, runner.device, static=True)
    runner.step = DecodeStep(runner.model, runner.state, runner.device)
    runner.step.use_graphs = True                        # as on CUDA: the step's position stays on the device
    prompt, forced = PROMPT_IDS[:45], [(i * 53) % 390 + 3 for i in range(21)]      # the prompt crosses EOS twice
    forced[9] = EOS
    with torch.inference_mode():
        ours = [runner.prefill(prompt).clone()]
        ours += [runner.decode(token, len(prompt) + i).clone() for i, token in enumerate(forced)]
        theirs = load_reference(text_dir)(torch.tensor([prompt + forced])).logits[0, len(prompt) - 1:]
    assert runner.state.buffers[1]["index_blocks"].shape == (24, TEXT["indexer_head_dim"])      # 96 tokens / 4
    torch.testing.assert_close(torch.stack(ours), theirs, rtol=1e-4, atol=1e-4)
    assert torch.equal(torch.stack(ours).argmax(-1), theirs.argmax(-1))
    eng.close()


@pytest.mark.parametrize("held,heads,kv_heads", [(37, 8, 2), (96, 4, 4), (5, 6, 1)])   # odd S; no groups; one KV head
def test_a_decode_query_attends_kv_in_place_as_the_repeated_heads_do(held, heads, kv_heads):
    """The CUDA decode's QSA attention (each KV head's query heads as rows, K and V never repeated), run on the CPU
    against the prompt path's repeated heads."""
    from engine.model.qwen4.qsa import _one_query_attention, masked_attention
    torch.manual_seed(held)
    q, k, v = torch.randn(1, heads, 16), torch.randn(held, kv_heads, 16), torch.randn(held, kv_heads, 16)
    visible = torch.rand(1, held) < 0.5
    visible[0, 0] = True
    torch.testing.assert_close(_one_query_attention(q, k, v, visible), masked_attention(q, k, v, visible),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("held,max_blocks", [(40, 3), (42, 3), (13, 5)])    # R = 4: S a multiple; not; B < budget
def test_a_graph_step_gathers_exactly_the_positions_the_prompt_path_sees(held, max_blocks):
    """The graph's one-token step scores every block row of the whole static state and gathers budget + R rows;
    at each position (none complete yet, fewer than the budget, more) they are the prompt path's visible set."""
    from engine.model.qwen4.qsa import picked_rows, selection
    ratio, gen = 4, torch.Generator().manual_seed(held)
    for position in range(held):
        scores = torch.rand(1, held // ratio, generator=gen)
        rows, counts = picked_rows(scores, torch.tensor([position]), held, ratio, max_blocks)
        assert rows.shape == (min(max_blocks, held // ratio) * ratio + ratio,) and int(rows.max()) < held
        gathered = torch.zeros(held, dtype=torch.bool)
        gathered[rows[counts[0]]] = True
        assert int(counts.sum()) == int(gathered.sum())                    # no position counted twice
        seen = selection(scores[:, :(position + 1) // ratio], torch.tensor([position]), position, position + 1,
                         ratio, max_blocks)
        assert torch.equal(gathered[:position + 1], seen[0]) and not gathered[position + 1:].any()


def test_prefill_reads_each_distinct_row_once(text_dir, tmp_path):
    model_dir = repack(text_dir, tmp_path / "m")
    eng = streaming_engine(model_dir, device="cpu", dtype="float32")
    token_ids(eng, PROMPT_IDS, 1)                                 # the prompt's pass only
    ngram, index = eng.telemetry()["ngram"], read_index(model_dir)
    distinct = [np.unique(ids) for ids in _hasher().step(PROMPT_IDS, 0)]
    assert ngram["tokens"] == len(PROMPT_IDS)
    assert ngram["misses"] == ngram["rows"] == sum(d.size for d in distinct) and ngram["hits"] == 0
    pages = sum(len({(t.offset + r * index.row_stride) // PAGE for r in d.tolist()})
                for t, d in zip(index.tables, distinct))
    assert ngram["bytes_read"] == pages * PAGE                   # each page once
    assert ngram["bytes_used"] == ngram["rows"] * index.row_bytes
    assert ngram["rows_per_token"] == pytest.approx(ngram["rows"] / len(PROMPT_IDS))
    eng.close()


def test_where_ram_holds_the_whole_model_the_tables_are_held_and_no_step_reads_a_row(text_dir, tmp_path):
    model_dir = repack(text_dir, tmp_path / "m")
    index = read_index(model_dir)
    ram = open_model_dir(model_dir).expert_bytes_total + held_bytes(index.total_bytes)
    eng = engine.load(model_dir, device="cpu", dtype="float32", ram_cache=ram)
    held = eng.runner.model.ngram.held
    held._thread.join(timeout=60)                                  # the background read, front to back
    assert held.upto == index.total_bytes
    with open(model_dir / "ngram.bin", "rb") as f:
        assert held.data[:index.total_bytes].tobytes() == f.read(index.total_bytes)
    ours = token_ids(eng, PROMPT_IDS, NEW_TOKENS)
    ngram = eng.telemetry()["ngram"]
    assert ngram["misses"] == ngram["reads"] == ngram["bytes_read"] == 0 and ngram["hit_rate"] == 1.0
    assert ngram["cache_bytes"] >= index.total_bytes and ngram["held_read_bytes"] == ngram["cache_bytes"]
    assert ours == reference_greedy(load_reference(text_dir, "bf16"), PROMPT_IDS, NEW_TOKENS)
    eng.close()


def test_while_the_tables_are_read_a_row_past_the_part_read_comes_from_disk(text_dir, tmp_path):
    model_dir = repack(text_dir, tmp_path / "m")
    index = read_index(model_dir)
    ram = open_model_dir(model_dir).expert_bytes_total + held_bytes(index.total_bytes)
    eng = engine.load(model_dir, device="cpu", dtype="float32", ram_cache=ram)
    try:
        held = eng.runner.model.ngram.held
        held._thread.join(timeout=60)
        held.upto = index.total_bytes // 2 // PAGE * PAGE             # as if the background read were halfway
        first = token_ids(eng, PROMPT_IDS, 1)                         # the prompt's pass
        ngram = eng.telemetry()["ngram"]
    finally:
        eng.close()
    past = sum(int((t.offset + np.unique(ids).astype(np.int64) * index.row_stride + index.row_bytes
                    > held.upto).sum()) for t, ids in zip(index.tables, _hasher().step(PROMPT_IDS, 0)))
    assert 0 < past < ngram["rows"]
    assert ngram["misses"] == past and ngram["hits"] == ngram["rows"] - past
    assert first == reference_greedy(load_reference(text_dir, "bf16"), PROMPT_IDS, 1)


def test_the_default_ram_budget_holds_the_tables_beside_every_expert(text_dir, tmp_path):
    model_dir = repack(text_dir, tmp_path / "m")
    eng = engine.load(model_dir, device="cpu", dtype="float32")
    try:
        experts = open_model_dir(model_dir).expert_bytes_total
        assert eng.plan.ram_cache_bytes == experts + held_bytes(read_index(model_dir).total_bytes)
        assert eng.runner.model.ngram.held is not None
        assert eng.runner.experts.cache.num_slots * open_model_dir(model_dir).layout.block_bytes == experts
    finally:
        eng.close()


def test_row_ids_match_transformers_across_steps():
    """The hashed ids, EOS resets included, as transformers' n-gram embedding computes them, whether the tokens
    come in one step or one at a time (the history carried between steps)."""
    from transformers import AutoConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextNGramEmbedding

    cfg = AutoConfig.for_model("qwen4_exp_text", **TEXT)
    tokens = [EOS, 5, 7, EOS, 9, 9, 9, 11, EOS, EOS, 13, 399, 1, 2, 3]
    for ple_index, layer in enumerate(cfg.ple_layer_ids):
        module = Qwen4ExpTextNGramEmbedding(cfg, cfg.ple_embed_dim, layer - 1, ple_index)
        with torch.no_grad():
            module.ngram_embedding.weight.zero_()[:, 0] = torch.arange(module.ngram_embedding.weight.shape[0])
            theirs = module(torch.tensor([tokens]), None)[0, :, ::module.ngram_embedding.weight.shape[1]].long()
        hasher = _hasher()
        assert np.array_equal(hasher.step(tokens, 0)[ple_index], theirs.numpy())
        one_by_one = [hasher.step([t], i)[ple_index] for i, t in enumerate(tokens)]
        assert np.array_equal(np.concatenate(one_by_one), theirs.numpy())


def test_an_image_in_a_request_gets_one_sentence(multimodal_dir, tmp_path):
    eng = engine.load(repack(multimodal_dir, tmp_path / "m"), device="cpu")
    message = {"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image", "url": "a.png"}]}
    with pytest.raises(SluiceError, match="Images are not supported"):
        list(eng.generate([message], GenerationParams(max_new_tokens=2)))
    eng.close()


def test_fused_experts_and_whole_tables_repack_the_same(text_dir, tmp_path):
    """transformers' in-memory layout (experts fused per layer, each table whole) repacks to the same model as the
    Hub's (experts one by one, tables in split_ngram_parts shards)."""
    import re
    import shutil
    from safetensors.torch import load_file, save_file

    fused_dir = tmp_path / "fused"
    shutil.copytree(text_dir, fused_dir)
    (path,) = fused_dir.glob("*.safetensors")
    hub = load_file(str(path))
    out = {n: t for n, t in hub.items() if ".experts." not in n and ".shard_" not in n}
    for layer in range(TEXT["num_hidden_layers"]):
        p = f"model.layers.{layer}.mlp.experts."
        out[p + "gate_up_proj"] = torch.stack([torch.cat([hub[f"{p}{e}.gate_proj.weight"], hub[f"{p}{e}.up_proj.weight"]])
                                               for e in range(TEXT["num_experts"])])
        out[p + "down_proj"] = torch.stack([hub[f"{p}{e}.down_proj.weight"] for e in range(TEXT["num_experts"])])
    for name in [n for n in hub if n.endswith(".shard_0.weight")]:
        shards = sorted((n for n in hub if n.startswith(name[:-len("shard_0.weight")])),
                        key=lambda n: int(re.search(r"shard_(\d+)", n).group(1)))
        out[name.replace(".shard_0", "")] = torch.cat([hub[n] for n in shards])
    save_file(out, str(path), metadata={"format": "pt"})
    engines = [streaming_engine(repack(d, tmp_path / f"m{i}"), device="cpu", dtype="float32")
               for i, d in enumerate((text_dir, fused_dir))]
    hub_tokens, fused_tokens = (token_ids(e, PROMPT_IDS, 8) for e in engines)
    assert hub_tokens == fused_tokens
    for e in engines:
        e.close()


@pytest.mark.parametrize("checkpoint", ["text", "multimodal"])
def test_the_estimate_counts_parameters_as_transformers_and_n_gram_rows_per_token(checkpoint, request):
    import json
    from transformers import AutoModelForCausalLM
    from engine.plan.estimate import Machine, estimate, model_shape, ngram_disk_bytes

    hf_dir = request.getfixturevalue(f"{checkpoint}_dir")
    config = json.loads((hf_dir / "config.json").read_text())
    params = dict(AutoModelForCausalLM.from_pretrained(str(hf_dir)).named_parameters())
    shape = model_shape(config)
    assert shape.total_params == sum(p.numel() for p in params.values())
    assert shape.dense_params == sum(p.numel() for n, p in params.items()
                                     if ".experts." not in n and "ngram_embedding" not in n)
    assert ngram_disk_bytes(shape) == len(TEXT["ple_layer_ids"]) * 2 * TEXT["heads_per_ngram"] * PAGE
    machine = Machine("cpu", ram_available_bytes=1 << 30, mem_bw_bps=20e9, disk_read_bps=1e9, free_disk_bytes=1 << 40)
    est = estimate(config, 1 << 20, machine)
    assert est.disk_bytes_per_token >= ngram_disk_bytes(shape)


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_damaged_n_gram_file_gets_one_sentence(damage, text_dir, tmp_path):
    model_dir = repack(text_dir, tmp_path / "m")
    if damage == "missing":
        (model_dir / "ngram.bin").unlink()
    else:
        with open(model_dir / "ngram.bin", "r+b") as f:
            f.truncate(PAGE)
    with pytest.raises(SluiceError, match="repack"):
        engine.load(model_dir, device="cpu")


def test_multi_token_prediction_weights_are_kept_on_disk(text_dir, tmp_path):
    import shutil
    from safetensors.torch import load_file, save_file

    src = tmp_path / "with_mtp"
    shutil.copytree(text_dir, src)
    (path,) = src.glob("*.safetensors")
    tensors = load_file(str(path))
    mtp = {"mtp.fc.weight": torch.randn(64, 128).to(torch.bfloat16), "mtp.norm.weight": torch.randn(64)}
    save_file({**tensors, **mtp}, str(path), metadata={"format": "pt"})
    model_dir = repack(src, tmp_path / "m")
    kept = load_file(str(model_dir / "mtp.safetensors"))
    assert kept.keys() == mtp.keys() and all(torch.equal(kept[n], mtp[n]) for n in mtp)
    with safe_open(str(model_dir / "dense.safetensors"), "pt") as f:
        assert not any(n.startswith("mtp.") for n in f.keys())
    eng = engine.load(model_dir, device="cpu")             # loads (and checks) without them
    eng.close()
