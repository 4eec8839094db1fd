"""config.json builders for k3-mini and its drafter (structure copied from K3's release config)."""
import copy

QUANT = {
    "quant_method": "compressed-tensors",
    "format": "mxfp4-pack-quantized",
    "quantization_status": "compressed",
    "global_compression_ratio": None,
    "kv_cache_scheme": None,
    "config_groups": {
        "group_0": {
            "format": "mxfp4-pack-quantized",
            "targets": ["Linear"],
            "input_activations": None,
            "output_activations": None,
            "weights": {
                "num_bits": 4, "type": "float", "symmetric": True, "group_size": 32,
                "strategy": "group", "dynamic": False, "observer": "minmax", "observer_kwargs": {},
                "scale_dtype": "torch.uint8", "zp_dtype": None, "actorder": None, "block_structure": None,
            },
        }
    },
    "ignore": [
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
        "re:.*lm_head.*",
        "re:.*vision_tower.*",
        "re:.*mm_projector.*",
    ],
}


def make_config(vocab=4096, hidden=192, layers=8, mla_every=4, kda_heads=4, kda_dim=64,
                mla_heads=4, q_lora=128, kv_lora=64, nope=32, rope=16, v_dim=32,
                dense_ff=512, experts=32, topk=4, shared=1, moe_ff=128, latent=96,
                block=4):
    V = vocab
    bos, eos, pad = V - 256, V - 256 + 2, V - 1
    full = [L for L in range(1, layers + 1) if L % mla_every == 0]
    if layers not in full and layers > 1 and mla_every < 99:
        pass
    kda = [L for L in range(1, layers + 1) if L not in full]
    tc = {
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "dtype": "bfloat16",
        "vocab_size": V,
        "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
        "hidden_size": hidden,
        "intermediate_size": dense_ff,
        "num_hidden_layers": layers,
        "num_attention_heads": mla_heads,
        "num_key_value_heads": mla_heads,
        "hidden_act": "situ",
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "rms_norm_eps": 1e-05,
        "max_position_embeddings": 1048576,
        "tie_word_embeddings": False,
        "use_cache": True,
        "attn_res_block_size": block,
        "q_lora_rank": q_lora,
        "kv_lora_rank": kv_lora,
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v_dim,
        "mla_use_nope": True,
        "mla_use_output_gate": True,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_experts": experts,
        "num_experts_per_token": topk,
        "num_shared_experts": shared,
        "moe_intermediate_size": moe_ff,
        "routed_expert_hidden_size": latent,
        "latent_moe_use_norm": True,
        "moe_router_activation_func": "sigmoid",
        "moe_renormalize": True,
        "routed_scaling_factor": 1.0,
        "topk_method": "noaux_tc",
        "use_grouped_topk": True,
        "num_expert_group": 1,
        "topk_group": 1,
        "num_nextn_predict_layers": 0,
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": full,
            "num_heads": kda_heads,
            "head_dim": kda_dim,
            "short_conv_kernel_size": 4,
            "use_full_rank_gate": True,
            "gate_lower_bound": -5.0,
        },
        "quantization_config": copy.deepcopy(QUANT),
    }
    return {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "dtype": "bfloat16",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "media_placeholder_token_id": V - 256 + 21,
        "tie_word_embeddings": False,
        "text_config": tc,
    }


PRESETS = {
    # main model
    "mini": dict(),
    # drafter: layer 0 dense KDA + one KDA MoE layer
    "draft": dict(hidden=128, layers=2, mla_every=99, kda_heads=2, kda_dim=64, mla_heads=2,
                  q_lora=64, kv_lora=32, nope=32, rope=16, v_dim=32, dense_ff=384,
                  experts=8, topk=2, moe_ff=64, latent=64, block=2),
}


def preset(name, **over):
    kw = dict(PRESETS[name])
    kw.update(over)
    return make_config(**kw)
