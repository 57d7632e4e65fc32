#!/usr/bin/env bash
# one device call: SDPA diagnosis, then the harness's equality steps (fixed mask), then a short timing
export PYTHONUNBUFFERED=1
python3 -m venv --system-site-packages /tmp/v && python3 -c "import sysconfig; p = sysconfig.get_paths(); print(p['purelib'])" > $(/tmp/v/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/p.pth
/tmp/v/bin/python -m pip install -q --no-index --find-links .gpu_wheels -r benchmarks/gpu_requirements.txt 2>&1 | grep -v "dependency\|requires\|resolver" | tail -2
P=/tmp/v/bin/python
D=$OUT/r; mkdir -p $D
{ for b in DEFAULT EFFICIENT_ATTENTION CUDNN_ATTENTION FLASH_ATTENTION MATH; do for l in plain padded; do timeout 25 python3 .gpu_diag/sdpa.py $b $l 2>&1 | grep -v Warn | tail -1; done; done; } | tee $D/sdpa.txt
t=$SECONDS; timeout 130 $P benchmarks/gpu_check.py equality --out $D --device cuda --dtype float32 --max-new-tokens 32 > $D/eq32.log 2>&1; echo "float32 equality rc=$? $((SECONDS-t)) s" | tee -a $D/times.txt
t=$SECONDS; timeout 100 $P benchmarks/gpu_check.py equality --out $D --device cuda --dtype bfloat16 --max-new-tokens 32 > $D/eq16.log 2>&1; echo "bfloat16 equality rc=$? $((SECONDS-t)) s" | tee -a $D/times.txt
t=$SECONDS; timeout 50 $P benchmarks/gpu_check.py timing --out $D --device cuda --shapes qwen2.5-1.5b --dtype bfloat16 --decoders vanilla,hf_greedy,speculative,prompt_lookup,opt_tree --max-new-tokens 64 --prompts 1 --prompt-tokens 128 --repeats 2 > $D/timing.log 2>&1; echo "timing rc=$? $((SECONDS-t)) s" | tee -a $D/times.txt
cat $D/equality_float32.txt $D/equality_bfloat16.txt 2>/dev/null | head -70; grep -v Warn $D/timing.log | tail -15
