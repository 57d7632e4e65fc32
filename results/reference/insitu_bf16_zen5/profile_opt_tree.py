"""Where an opt_tree step's time goes on the real pair (bf16, this CPU): torch profiler over one decode."""
import sys, time, argparse
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/benchmarks")
import torch
from humaneval_prompts import add_model_arguments, load_prompts
from decoders.common.cost import forward_cost_curve
from harness.api import build_decoder
p = argparse.ArgumentParser(); add_model_arguments(p, 1); p.add_argument("--decoder", default="opt_tree")
args = p.parse_args()
pair, eos, prompts = load_prompts(args, need_draft=True)
ids = prompts[0][1]
for role, m in (("target", pair.target), ("draft", pair.draft)):
    c = forward_cost_curve(m, [1, 4, 8, 16, 32, 64], context=ids)
    print(role, "bare forward s by tokens fed:", {k: round(v, 4) for k, v in c.items()}, flush=True)
dec = build_decoder(args.decoder, pair, eos_token_ids=eos)
dec.generate(ids, 16)
t = time.perf_counter(); res = dec.generate(ids, args.max_new_tokens); wall = time.perf_counter() - t
print(f"{args.decoder}: {res.new_tokens} tokens in {wall:.2f} s, steps {len(res.steps) - 1}, accept {res.accept_length:.2f}", flush=True)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    dec.generate(ids, args.max_new_tokens)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=50))
