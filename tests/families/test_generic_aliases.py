"""Model-type aliases: a text-only checkpoint of a supported family (`qwen3_5_moe_text`, as transformers' causal
LM of Qwen3.5 saves it) runs as its family does, token-exact while experts stream."""
import torch

from engine.format.repack import repack
from tests.families.hybrid_models import QWEN3_5_TEXT, _random_like
from tests.families.tokens import assert_streamed_tokens_match


def build_qwen3_5_text(dst):
    from transformers import AutoConfig, AutoModelForCausalLM
    from engine.tools.demo import train_tiny_tokenizer
    dst.mkdir(parents=True)
    train_tiny_tokenizer(dst)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_5_moe_text", **QWEN3_5_TEXT))
    torch.manual_seed(2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(_random_like(name, param))
    model.eval().to(torch.bfloat16).save_pretrained(str(dst))
    return dst


def test_a_qwen3_5_text_checkpoint_runs_as_qwen3_5(tmp_path):
    hf_dir = build_qwen3_5_text(tmp_path / "hf")
    model_dir = repack(hf_dir, tmp_path / "sluice")
    assert_streamed_tokens_match(hf_dir, model_dir, "bf16")


def test_the_estimate_counts_a_qwen3_5_text_checkpoint_as_its_model(tmp_path):
    import json

    from engine.plan.estimate import model_shape
    hf_dir = build_qwen3_5_text(tmp_path / "hf")
    from transformers import AutoModelForCausalLM
    params = AutoModelForCausalLM.from_pretrained(str(hf_dir)).num_parameters()
    assert model_shape(json.loads((hf_dir / "config.json").read_text())).total_params == params
