#!/usr/bin/env bash
# Regenerates testdata/k3-quant (a K3-shaped model quantized by llama.cpp's
# own quantizer: Q8_0 trunk, Q4_K experts) and testdata/k3-quant-ref (its
# float64 reference, tools/train/gguf_reference.py), read by
# tests/test_mini quantized_gguf_matches_pytorch.  Deterministic.
# Needs: npm ci --prefix tests/llama (llama.cpp's libraries), npm (gguf-py via
# tests/llama/get_gguf_py.sh), Debian's python3-torch and python3-numpy.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s build/k3gen build/llama_peer
lib=tests/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
gpy=$(tests/llama/get_gguf_py.sh)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# K3's structure at a small size: KDA and MLA layers, a dense first layer, latent MoE with a
# shared expert; expert rows 256 wide so that Q4_K applies to them (not a 32-value fallback); KDA and
# MLA head counts equal, as llama.cpp needs to load it (it sizes KDA layers from the MLA count)
build/k3gen --out "$tmp/src" --preset tiny --seed 31 --set hidden_size=64 --set num_hidden_layers=4 \
    --set kv_lora_rank=32 --set qk_nope_head_dim=32 --set v_head_dim=32 --set num_experts=8 \
    --set num_experts_per_token=2 --set moe_intermediate_size=256 --set routed_expert_hidden_size=256 \
    --set vocab_size=512 --set kda_heads=4 --set num_attention_heads=4 --gguf "$tmp/src.gguf" >/dev/null
mkdir -p testdata/k3-quant
build/llama_peer --lib "$lib" --model "$tmp/src.gguf" --quantize testdata/k3-quant/model.gguf \
    --quantize-type q8_0 --quantize-experts q4_k
cp "$tmp/src/config.json" testdata/k3-quant/source-config.json
rm -rf testdata/k3-quant-ref
OMP_NUM_THREADS=1 /usr/bin/python3 tools/train/gguf_reference.py --gguf testdata/k3-quant/model.gguf \
    --config testdata/k3-quant/source-config.json --gguf-py "$gpy" --out testdata/k3-quant-ref
