#!/usr/bin/env bash
# What quantizing loses, measured: a model's GGUF through llama.cpp's own
# quantizer (llama_model_quantize, npm prebuilt) for each ftype, the routed
# experts kept MXFP4 (K3's release recipe) and, for the K-quant ftypes, also
# requantized by the ftype's own rules (the small-file recipes); each file's
# `deltafin perplexity --kl-divergence` against the unquantized model's
# logits (saved once with --save-logits), one table row per file: size,
# trunk and expert types, mean / median / 99 % KL divergence, top-1
# agreement, perplexity ratio.
#
#   bench/bench_kld.sh [MODEL] [TEXT]
#
# MODEL: a K3 checkpoint directory (converted to GGUF with k3gen --from) or a
# GGUF (default: a K3-shaped generated model whose expert rows are 256 wide,
# so the K-quants apply to them); TEXT: held-out text (default:
# testdata/k3-mini-ref/heldout.txt).  KLD_WINDOW (256), KLD_BYTES (limit the
# text, default 40000), BENCH_DIR (kept), BENCH_THREADS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s build/deltafin build/k3gen build/llama_peer
lib=tests/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
if [ -n "${BENCH_DIR:-}" ]; then dir=$BENCH_DIR; made=0; mkdir -p "$dir"
else dir=$(mktemp -d /var/tmp/deltafin-kld.XXXXXX); made=1; fi
cleanup() { [ "$made" = 1 ] && rm -rf "$dir"; return 0; }
trap cleanup EXIT
model=${1:-}
text=${2:-testdata/k3-mini-ref/heldout.txt}
win=${KLD_WINDOW:-256}
thr=${BENCH_THREADS:-2}
head -c "${KLD_BYTES:-40000}" "$text" >"$dir/text.txt"
if [ -z "$model" ]; then
    gen="--preset small --seed 17 --set moe_intermediate_size=256 --set routed_expert_hidden_size=256 --set num_experts=32"
    # shellcheck disable=SC2086
    build/k3gen --out "$dir/model" $gen --gguf "$dir/base.gguf" >/dev/null
    what="a generated K3-shaped model (k3gen $gen)"
elif [ -d "$model" ]; then
    cfg=$model/config.json
    [ -f "$cfg" ] || { echo "bench_kld.sh: $model has no config.json" >&2; exit 2; }
    build/k3gen --from "$model" --gguf "$dir/base.gguf" $(/usr/bin/python3 - "$cfg" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
t = c.get("text_config", c)
keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank",
        "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_experts", "num_experts_per_token",
        "num_shared_experts", "moe_intermediate_size"]
print(" ".join("--set %s=%s" % (k, t[k]) for k in keys if k in t))
PY
) >/dev/null
    what="$model"
else
    cp "$model" "$dir/base.gguf"
    what="$model"
fi
build/deltafin perplexity --model "$dir/base.gguf" --file "$dir/text.txt" --window "$win" --threads "$thr" \
    --save-logits "$dir/base.kld" >/dev/null 2>&1
echo "== KL divergence against $what, $(wc -c <"$dir/text.txt") bytes of $text, windows of $win"
printf '| llama.cpp ftype | experts | file MiB | trunk types | expert types | mean KLD | median | 99 %% | top-1 | ppl ratio |\n'
printf '|---|---|---|---|---|---|---|---|---|---|\n'
for spec in q8_0:keep q6_k:keep q5_k_m:keep q4_k_m:keep q4_0:keep q3_k_m:keep q2_k:keep q8_0:q8_0 q6_k:mix \
    q5_k_m:mix q4_k_m:mix q3_k_m:mix q2_k:mix; do
    IFS=: read -r ft ex <<<"$spec"
    q="$dir/$ft-$ex.gguf"
    build/llama_peer --lib "$lib" --model "$dir/base.gguf" --quantize "$q" --quantize-type "$ft" \
        --quantize-experts "$ex" --threads "$thr"
    j=$(build/deltafin perplexity --model "$q" --file "$dir/text.txt" --window "$win" --threads "$thr" \
        --kl-divergence "$dir/base.kld" --json 2>/dev/null)
    info=$(build/deltafin info --model "$q")
    tt=$(sed -n 's/^trunk weights \([^ ]*\).*/\1/p' <<<"$info")
    et=$(sed -n 's/^expert weights \([^ ]*\).*/\1/p' <<<"$info")
    /usr/bin/python3 - "$j" "$ft" "$ex" "$(stat -c %s "$q")" "$tt" "$et" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
k = j.get("kld", j)
def g(*names):
    for n in names:
        if n in k:
            return k[n]
    return float("nan")
print("| %s | %s | %.1f | %s | %s | %.5f | %.5f | %.4f | %.1f %% | %.4f |" % (
    sys.argv[2].upper(), {"keep": "MXFP4 kept", "mix": "requantized (ftype's mix)", "q8_0": "Q8_0"}[sys.argv[3]],
    int(sys.argv[4]) / 2**20, sys.argv[5], sys.argv[6], g("kld_mean", "mean"), g("kld_median", "median"),
    g("kld_p99", "p99"), 100 * g("top1_agreement", "top1", "same_top1"), g("perplexity_ratio", "ppl_ratio")))
PY
    rm -f "$q"
done
