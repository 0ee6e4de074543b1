"""A tiny Llama made on the spot for the vLLM peer tests: config.json, a word-level tokenizer built
with the ``tokenizers`` library (tokenizer.json, tokenizer_config.json) and random weights in
model.safetensors. Nothing comes from a hub.

The shapes are the smallest vLLM's CPU backend runs: head size 32 (its smallest supported head
size), 2 layers, 2 query heads and 1 KV head (grouped-query attention), hidden size 64, a vocabulary
of 512 words. The weights are drawn from a seeded generator, so every build of one seed is the same
model; a different ``seed`` is a "weight update" (other weights, same shapes).

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


def build(out: Path, seed: int = 0) -> Path:
    """Writes the model directory ``out`` (created if missing) and returns it."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

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
        "unk_token": "<unk>", "model_max_length": MAX_POSITIONS, "add_bos_token": True,
    }, indent=1))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
    }, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))

    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).contiguous()

    inter = 2 * HIDDEN
    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rnd(VOCAB, HIDDEN, scale=1.0),
                                  "model.norm.weight": torch.ones(HIDDEN),
                                  "lm_head.weight": rnd(VOCAB, HIDDEN)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
        w[p + "self_attn.q_proj.weight"] = rnd(HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = rnd(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = rnd(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = rnd(HIDDEN, HEADS * HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = rnd(inter, HIDDEN)
        w[p + "mlp.up_proj.weight"] = rnd(inter, HIDDEN)
        w[p + "mlp.down_proj.weight"] = rnd(HIDDEN, inter)
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


if __name__ == "__main__":
    build(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
