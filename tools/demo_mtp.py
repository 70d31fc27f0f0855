"""Qwen's MTP block for the demo model, in PyTorch from transformers' Qwen3_5Moe classes.

Named as Qwen3.5/3.6 checkpoints name it (under `mtp.`): `fc` (H, 2H), `pre_fc_norm_embedding`,
`pre_fc_norm_hidden`, `layers.0` (a full-attention decoder layer with the MoE, named like a trunk
layer) and `norm`. For trunk position i, with h_i the trunk's hidden after its final norm:

    u = fc(concat(pre_fc_norm_embedding(embed(x_{i+1})), pre_fc_norm_hidden(h_i)))
    x = layers.0(u)        causal attention over the block's own positions, the trunk's RoPE
    logits = lm_head(norm(x))   predicts x_{i+2}; embed and lm_head are the trunk's
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.masking_utils import create_causal_mask
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer, Qwen3_5MoeRMSNorm


class MtpBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        # the block's layer is a full-attention layer, numbered after the trunk's
        layer_config = copy.deepcopy(config)
        layer_config.layer_types = list(config.layer_types) + ["full_attention"]
        layer_config.num_hidden_layers = config.num_hidden_layers + 1
        self.config = layer_config
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5MoeRMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5MoeRMSNorm(hidden, eps=eps)
        self.layers = nn.ModuleList([Qwen3_5MoeDecoderLayer(layer_config, config.num_hidden_layers)])
        self.norm = Qwen3_5MoeRMSNorm(hidden, eps=eps)

    def forward(self, trunk, next_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """next_ids: [B, T] (x_{i+1}); hidden: [B, T, H] (h_i) -> [B, T, H], normed for the LM head."""
        embeds = trunk.model.embed_tokens(next_ids)
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        positions = torch.arange(u.shape[1], device=u.device).view(1, -1).expand(u.shape[0], -1)
        rope = trunk.model.rotary_emb(u, positions[None])
        mask = create_causal_mask(config=self.config, inputs_embeds=u, attention_mask=None, cache=None,
                                  position_ids=positions)
        x = self.layers[0](u, position_embeddings=rope, attention_mask=mask, position_ids=positions)
        return self.norm(x)
