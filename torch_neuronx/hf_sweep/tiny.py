"""Tiny random models from any architecture's config, offline: the default config with every
size-like field shrunk, passed back through the config's constructor so the fields it derives
(layer types, head dims, expert lists) follow."""

VOCAB = 128
HIDDEN = 64
HEADS = 4

# Size fields of transformers configs, under every name the library uses for them.
SIZES = {
    "vocab_size": VOCAB,
    **dict.fromkeys(["hidden_size", "n_embd", "d_model", "dim", "embed_dim", "model_dim", "n_embed",
                     "word_embed_proj_dim", "embedding_size", "hidden_dim", "d_embed"], HIDDEN),
    **dict.fromkeys(["num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers",
                     "encoder_layers", "num_decoder_layers", "num_encoder_layers", "depth"], 2),
    **dict.fromkeys(["num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "attention_heads"], HEADS),
    **dict.fromkeys(["num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"], 2),
    "head_dim": HIDDEN // HEADS,
    **dict.fromkeys(["intermediate_size", "ffn_dim", "n_inner", "decoder_ffn_dim", "encoder_ffn_dim",
                     "ffn_hidden_size", "d_ff", "inner_hidden_size", "mlp_dim", "d_inner",
                     "ffn_inner_hidden_size"], 128),
    **dict.fromkeys(["moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
                     "moe_ffn_hidden_size", "expert_ffn_hidden_size"], 32),
    **dict.fromkeys(["num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
                     "num_routed_experts"], 4),
    **dict.fromkeys(["num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token", "moe_k"], 2),
    **dict.fromkeys(["max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length",
                     "max_sequence_length"], 256),
}


# Architecture-specific fields (latent-attention ranks, rotary and state sizes).
SIZES.update({
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "index_head_dim": 16, "index_n_heads": 2, "rotary_dim": 8, "rotary_emb_base": 10000,
    "num_shared_experts": 1, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "num_codebooks": 2, "num_global_experts": 4, "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 16, "emb_dim": HIDDEN, "d_head": HIDDEN // HEADS, "decoder_vocab_size": VOCAB,
    "mamba_n_heads": HEADS, "mamba_d_state": 16, "state_size": 16, "conv_L_cache": 3, "n_groups": 1,
})
# Per-stage lists of vision backbones.
STAGE_LISTS = {
    "depths": lambda v: [1] * len(v),
    "hidden_sizes": lambda v: [min(x, 16 << i) for i, x in enumerate(v)],
    "embed_dims": lambda v: [min(x, 16 << i) for i, x in enumerate(v)],
    "neck_hidden_sizes": lambda v: [min(x, 16 << i) for i, x in enumerate(v)],
    "num_heads": lambda v: [min(x, 2) for x in v],
}
SIZES["image_size"] = 32
# Fields a default config leaves None and the modeling code needs.
FILL_NONE = {"head_dim": HIDDEN // HEADS, "num_key_value_heads": 2, "num_experts_per_tok": 2, "n_group": 1,
             "topk_group": 1}
MAX_LAYERS = 4
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
MAX_PARAMS = 20_000_000


def _layers(d):
    return next((d[k] for k in LAYER_KEYS if isinstance(d.get(k), int)), None)


def _layer_lists(d, n):
    return [k for k, v in d.items() if (isinstance(v, list) or isinstance(v, str) and "pattern" in k) and len(v) == n and n > 1
            and not k.endswith(("_token_id", "architectures"))]


def _keep_layers(d, old, new):
    """Indices of the layers to keep: the first of each distinct kind in the per-layer lists
    (so a hybrid model keeps an attention and a recurrent layer), topped up to ``new``."""
    lists = [d[k] for k in _layer_lists(d, old)]
    keep, seen = [], set()
    for i in range(old):
        kind = tuple(str(v[i]) for v in lists)
        if kind not in seen and len(keep) < MAX_LAYERS:
            seen.add(kind)
            keep.append(i)
    for i in range(old):
        if len(keep) >= new:
            break
        if i not in keep:
            keep.append(i)
    return sorted(keep)


def _random_rate(key):
    return any(w in key for w in ("dropout", "_pdrop", "drop_path", "drop_rate", "jitter", "layerdrop"))


def shrink_dict(d, depth=0, decoder=False):
    """Shrink a config dict in place (recursing into sub-config dicts)."""
    old_layers = _layers(d)
    for k, v in list(d.items()):
        if isinstance(v, bool):
            continue
        if k in SIZES and isinstance(v, int):
            d[k] = min(v, SIZES[k]) if k not in ("vocab_size",) else SIZES[k]
        elif k in STAGE_LISTS and isinstance(v, list) and v and all(isinstance(x, int) for x in v):
            d[k] = STAGE_LISTS[k](v)
        elif k in ("out_features", "out_indices") and v is not None:
            d[k] = None  # backbone stage names change with the depth; take the default (last stage)
        elif k in FILL_NONE and v is None:
            d[k] = FILL_NONE[k]
        elif _random_rate(k) and isinstance(v, float):
            d[k] = 0.0  # neuron and CPU draw different random numbers; compare the deterministic model
        elif _random_rate(k) and isinstance(v, list) and all(isinstance(x, (int, float)) for x in v):
            d[k] = [0.0] * len(v)
        elif isinstance(v, dict) and "model_type" in v and depth < 3:
            shrink_dict(v, depth + 1)
    if "qk_rope_head_dim" in d and "head_dim" in d:
        d["head_dim"] = d["qk_rope_head_dim"]  # latent attention: head_dim is the rotary part
    if "kv_lora_rank" in d and isinstance(d.get("num_attention_heads"), int):
        d["num_key_value_heads"] = d["num_attention_heads"]  # latent attention has no grouped KV
        if "qk_head_dim" in d:
            d["qk_head_dim"] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    for k, v in (("attn_layer_period", 2), ("attn_layer_offset", 1), ("expert_layer_period", 2),
                 ("expert_layer_offset", 1), ("attn_layer_indices", [1]), ("block_types", ["recurrent", "attention"])):
        if k in d:
            d[k] = v  # hybrid models: keep one attention layer among the two
    if decoder and "is_decoder" in d:
        d["is_decoder"] = True
    for nh, hd, ex in (("num_heads", "head_dim", "expand"), ("mamba_n_heads", "mamba_d_head", "mamba_expand")):
        if all(isinstance(d.get(k), int) for k in (nh, hd, ex)) and isinstance(d.get("hidden_size"), int):
            d[hd] = d["hidden_size"] * d[ex] // d[nh]  # Mamba-2: heads x head dim = expanded width
    new_layers = _layers(d)
    if old_layers and new_layers and new_layers != old_layers:
        keep = _keep_layers(d, old_layers, new_layers)
        for k in LAYER_KEYS:
            if isinstance(d.get(k), int):
                d[k] = len(keep)
        for k in _layer_lists(d, old_layers):
            v = d[k]
            picked = [v[i] for i in keep]
            d[k] = "".join(picked) if isinstance(v, str) else picked
        for k, v in list(d.items()):
            if "layer" in k and isinstance(v, dict) and v and all(str(i).isdigit() for i in v):
                width = len(str(next(iter(v))))
                v = {str(i): c for i, c in v.items()}
                d[k] = {str(j).zfill(width): v[str(i).zfill(width)] for j, i in enumerate(keep)
                        if str(i).zfill(width) in v}  # per-layer overrides, renumbered
    return d


def shrink(cfg_cls, decoder=False):
    """A tiny instance of ``cfg_cls`` (a PretrainedConfig subclass); ``decoder`` marks configs of
    encoder architectures used as causal LMs (``is_decoder=True``)."""
    d = cfg_cls().to_dict()
    d.pop("transformers_version", None)
    shrink_dict(d, decoder=decoder)
    cfg = cfg_cls.from_dict(d)
    _fix_token_ids(cfg)
    for sub in _sub_configs(cfg):
        _fix_token_ids(sub)
    return cfg


def _sub_configs(cfg):
    from transformers import PretrainedConfig
    return [v for v in vars(cfg).values() if isinstance(v, PretrainedConfig)]


def _fix_token_ids(cfg):
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int):
        return
    for k, v in list(vars(cfg).items()):
        if k.endswith("token_id") and isinstance(v, int) and v >= vocab:
            setattr(cfg, k, vocab - 1 - (hash(k) % 4))
        elif k.endswith("token_id") and isinstance(v, list):
            setattr(cfg, k, [t if t < vocab else vocab - 1 for t in v])


def config_for(model_type, decoder=False):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    return shrink(CONFIG_MAPPING[model_type], decoder)


# Set-up a model type needs before its first forward (as its model card documents).
PREPARE = {
    "xmod": lambda m: m.set_default_language("en_XX"),
}


def prepare(model_type, model):
    if model_type in PREPARE:
        PREPARE[model_type](model)
    return model
