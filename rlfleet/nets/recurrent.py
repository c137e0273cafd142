"""An LSTM core that sits between an encoder and the heads, with the hidden state reset at episode starts."""

from __future__ import annotations

import torch
from torch import nn

State = tuple[torch.Tensor, torch.Tensor]


class LSTMCore(nn.Module):
    """LSTM over time for `[T, B, F]` features (or one step of `[B, F]`).

    `starts[t, b]` = 1 where a new episode begins at step t: the state is zeroed before that step, so
    one segment can span several episodes and training sees the same states acting did.
    """

    def __init__(self, in_dim: int, hidden: int = 256):
        super().__init__()
        self.cell = nn.LSTMCell(in_dim, hidden)
        self.out_dim = hidden

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> State:
        zeros = torch.zeros(batch, self.out_dim, device=device)
        return zeros, zeros.clone()

    def forward(self, features: torch.Tensor, state: State, starts: torch.Tensor) -> tuple[torch.Tensor, State]:
        single = features.dim() == 2
        if single:
            features, starts = features.unsqueeze(0), starts.unsqueeze(0)
        h, c = state
        outputs = []
        for t in range(features.shape[0]):
            keep = (1.0 - starts[t].float()).unsqueeze(-1)
            h, c = self.cell(features[t], (h * keep, c * keep))
            outputs.append(h)
        out = torch.stack(outputs)
        return (out[0] if single else out), (h, c)
