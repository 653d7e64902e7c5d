"""bf16 vs float32 logits of one decode run, step by step, with each MoE layer's routed experts and
weights in both: whether a bf16 error comes from a routing flip. `python scripts/logits_routes.py [cuda]`."""
import tempfile, torch
from pathlib import Path
import engine
from engine.tools.demo import build_hf_model
from engine.format.repack import repack
import sys
DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"
if DEVICE == "cpu":
    torch.set_num_threads(1)
family = "mixtral"
tmp = Path(tempfile.mkdtemp())
build_hf_model(family, tmp / "hf", num_layers=3, with_tokenizer=False, seed=5)
repack(tmp / "hf", tmp / "sl", quant="bf16")
prompt = list(range(3, 40, 3))
logits, ids, tokens = {}, {}, None
for dtype in ("float32", "bfloat16"):
    eng = engine.load(tmp / "sl", device=DEVICE, dtype=dtype, max_context=64)
    with torch.inference_mode():
        first = eng.runner.prefill(prompt)
        tokens = tokens or [int(first.argmax())] + [3, 11, 29]
        rows, routes = [], []
        for i, tok in enumerate(tokens):
            rows.append(eng.runner.decode(tok, len(prompt) + i).clone())
            s = eng.runner.step
            routes.append({l: (s.out[l].ids.tolist()[:eng.spec.top_k], s.out[l].route_weights.float().tolist())
                           for l in s.moe_out})
    logits[dtype], ids[dtype] = torch.stack(rows), routes
    eng.close()
a, b = logits["float32"].double().cpu(), logits["bfloat16"].double().cpu()
for i in range(len(tokens)):
    print(f"step {i}: rel err {((a[i]-b[i]).norm()/a[i].norm()).item():.3f}")
    for l in ids["float32"][i]:
        f, g = ids["float32"][i][l], ids["bfloat16"][i][l]
        print(f"   layer {l}: fp32 {f[0]} w {[round(x,3) for x in f[1][0]]} | bf16 {g[0]} w {[round(x,3) for x in g[1][0]]}")
print("all-steps rel", ((a-b).norm()/a.norm()).item())
from transformers import AutoModelForCausalLM
out = {}
for dt in (torch.float32, torch.bfloat16):
    m = AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=dt).to(DEVICE)
    with torch.inference_mode():
        out[dt] = m(torch.tensor([prompt + tokens], device=DEVICE)).logits[0, -4:].double()
x, y = out[torch.float32].cpu(), out[torch.bfloat16].cpu()
print("transformers bf16 vs fp32 per step:", [round(((x[i]-y[i]).norm()/x[i].norm()).item(), 3) for i in range(4)])
# sluice fp32 vs transformers fp32
print("sluice fp32 vs transformers fp32:", [round(((a[i]-x[i]).norm()/x[i].norm()).item(), 5) for i in range(4)])
