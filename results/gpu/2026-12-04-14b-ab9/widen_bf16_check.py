import torch, sys
from pathlib import Path
from transformers import AutoTokenizer, LlamaForCausalLM
from faser_sglang.kit.smollm2 import build_smollm2
from faser_sglang.kit.drafts import widen
from faser_sglang.bench import workloads
torch.set_num_threads(2)
out = Path("/tmp/wexp")
base = build_smollm2(out / "smollm2", dtype=torch.float32)
wide = widen(base, out / "wide", hidden_size=1024, intermediate_size=4096, num_heads=16, num_kv_heads=4, ballast_layers=4, dtype=torch.bfloat16)
tok = AutoTokenizer.from_pretrained(str(base))
reqs = workloads.load("humaneval", None)[:6]
m32 = LlamaForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
m16 = LlamaForCausalLM.from_pretrained(str(base), dtype=torch.bfloat16).eval()
mw = LlamaForCausalLM.from_pretrained(str(wide), dtype=torch.bfloat16).eval()
tot = a16 = aw = aw16 = 0
with torch.no_grad():
    for r in reqs:
        ids = torch.tensor([tok(r.prompt)["input_ids"]])
        seq = m16.generate(ids, max_new_tokens=160, min_new_tokens=160, do_sample=False, pad_token_id=tok.eos_token_id)
        n = ids.shape[1]
        l32 = m32(seq).logits[0, n-1:-1].argmax(-1)
        l16 = m16(seq).logits[0, n-1:-1].argmax(-1)
        lw = mw(seq).logits[0, n-1:-1].argmax(-1)
        tot += len(l32); a16 += int((l32 == l16).sum()); aw += int((l32 == lw).sum()); aw16 += int((l16 == lw).sum())
        print(len(l32), a16/tot, aw/tot, aw16/tot, flush=True)
print("bf16 vs fp32", a16/tot, "wide-bf16 vs fp32", aw/tot, "wide-bf16 vs bf16", aw16/tot)
