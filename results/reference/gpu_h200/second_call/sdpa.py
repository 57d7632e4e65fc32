"""SDPA with an additive bf16 mask on CUDA, per backend, plain (row stride = width) vs padded (stride % 16 == 0)."""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

backend, layout = sys.argv[1], sys.argv[2]
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)
worst, ran, skipped = 0.0, 0, 0
for d in (16, 128):
    for n in (1, 3, 16, 17):
        for past in (0, 7, 40, 123, 200):
            L = past + n
            q = torch.randn(1, 4, n, d, device=dev, dtype=dt)
            k = torch.randn(1, 4, L, d, device=dev, dtype=dt)
            v = torch.randn(1, 4, L, d, device=dev, dtype=dt)
            w = L if layout == "plain" else -(-L // 16) * 16
            m = torch.zeros(1, 1, n, w, device=dev, dtype=dt)[..., :L]
            m[0, 0, :, past:].masked_fill_(torch.ones(n, n, dtype=torch.bool, device=dev).triu(1), torch.finfo(dt).min)
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m.float())
            ctx = sdpa_kernel([getattr(SDPBackend, backend)]) if backend != "DEFAULT" else torch.no_grad()
            try:
                with ctx:
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                torch.cuda.synchronize()
            except RuntimeError as e:
                if "No available kernel" in str(e) or "not supported" in str(e).lower():
                    skipped += 1
                    continue
                print(f"{backend} {layout}: FAIL d={d} n={n} past={past} stride={m.stride()}: {str(e).splitlines()[0]}")
                sys.exit(1)
            ran += 1
            worst = max(worst, (o.float() - ref).abs().max().item())
print(f"{backend} {layout}: ok, {ran} shapes ran, {skipped} refused by the backend, max |err| vs fp32 {worst:.3g}")
