"""A tiny Llama made on the spot for the vLLM peer tests: config.json, a word-level tokenizer built
with the ``tokenizers`` library (tokenizer.json, tokenizer_config.json) and random weights in
model.safetensors. Nothing comes from a hub.

The shapes are the smallest vLLM's CPU backend runs: head size 32 (its smallest supported head
size), 2 layers, 2 query heads and 1 KV head (grouped-query attention), hidden size 64, a vocabulary
of 512 words. The weights are drawn from a seeded generator, so every build of one seed is the same
model; a different ``seed`` is a "weight update" (other weights, same shapes).

``build`` takes other shapes as keyword arguments (``layers``, ``hidden``, ``heads``, ``kv_heads``,
``intermediate``, ``max_positions``, ``dtype``, ``scale``): the benchmark (``kvpool_peers.bench_vllm``)
builds a larger model with it. The defaults are the tiny model above.

Run as a script to build one: ``python tiny_llama.py DIR [SEED]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 512
SPECIAL = ["<unk>", "<s>", "</s>"]
HIDDEN = 64
LAYERS = 2
HEADS = 2
KV_HEADS = 1
HEAD_DIM = HIDDEN // HEADS  # 32
MAX_POSITIONS = 1024


def words(n: int, start: int = 0) -> str:
    """A prompt of ``n`` words (one token each), ``w{start}`` onward, cycling through the vocabulary."""
    return " ".join(f"w{(start + i) % (VOCAB - len(SPECIAL))}" for i in range(n))


def build(out: Path, seed: int = 0, *, layers: int = LAYERS, hidden: int = HIDDEN, heads: int = HEADS,
          kv_heads: int = KV_HEADS, intermediate: int | None = None, max_positions: int = MAX_POSITIONS,
          dtype: str = "float32", scale: float = 0.2) -> Path:
    """Writes the model directory ``out`` (created if missing) and returns it. Weights are drawn as
    ``N(0, scale)`` (embeddings ``N(0, 1)``), stored in ``dtype`` (``float32`` or ``bfloat16``);
    ``intermediate`` defaults to ``2 * hidden``; the head size is ``hidden // heads``."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden {hidden}, heads {heads}, kv_heads {kv_heads}: heads must divide both")
    head_dim = hidden // heads
    inter = intermediate if intermediate is not None else 2 * hidden
    store = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    out.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    for i in range(VOCAB - len(SPECIAL)):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": max_positions, "add_bos_token": True,
    }, indent=1))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": VOCAB, "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": dtype,
    }, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))

    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = scale) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(store).contiguous()

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=store)

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rnd(VOCAB, hidden, scale=1.0),
                                  "model.norm.weight": ones(hidden),
                                  "lm_head.weight": rnd(VOCAB, hidden)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = ones(hidden)
        w[p + "post_attention_layernorm.weight"] = ones(hidden)
        w[p + "self_attn.q_proj.weight"] = rnd(heads * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = rnd(kv_heads * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = rnd(kv_heads * head_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = rnd(hidden, heads * head_dim)
        w[p + "mlp.gate_proj.weight"] = rnd(inter, hidden)
        w[p + "mlp.up_proj.weight"] = rnd(inter, hidden)
        w[p + "mlp.down_proj.weight"] = rnd(hidden, inter)
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


if __name__ == "__main__":
    build(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
