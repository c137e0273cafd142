"""An LSTM core that sits between an encoder and the heads, with the hidden state reset at episode starts."""

from __future__ import annotations

import numpy as np
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

    def initial_state(self, batch: int, device: torch.device | str | None = None) -> State:
        """Zeros for `batch` envs, on `device` (None: where the core's weights are)."""
        zeros = torch.zeros(batch, self.out_dim, device=device or self.cell.weight_hh.device)
        return zeros, zeros.clone()

    @staticmethod
    def reset(state: State, done: np.ndarray | torch.Tensor) -> State:
        """A new state with the rows of `done` (a `[B]` bool mask, NumPy or torch) zeroed; `state` is not changed."""
        keep = (~torch.as_tensor(done, dtype=torch.bool, device=state[0].device)).to(state[0].dtype).unsqueeze(-1)
        return state[0] * keep, state[1] * keep

    def forward(
        self, features: torch.Tensor, state: State, starts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, State]:
        """Outputs `[T, B, H]` (or `[B, H]`) and the state after the last step; `starts=None`: no resets."""
        single = features.dim() == 2
        if single:
            features = features.unsqueeze(0)
            starts = None if starts is None else starts.unsqueeze(0)
        hs, cs = self.states(features, state, starts)
        return (hs[0] if single else hs), (hs[-1], cs[-1])

    def states(self, features: torch.Tensor, state: State, starts: torch.Tensor | None = None) -> State:
        """The state `(h, c)` after every step of `[T, B, F]` features, each `[T, B, H]` (before any reset
        for the next step): what a one-step continuation from step t, e.g. to a final observation, needs."""
        h, c = state
        hs, cs = [], []
        for t in range(features.shape[0]):
            if starts is not None:
                keep = (1.0 - starts[t].float()).unsqueeze(-1)
                h, c = h * keep, c * keep
            h, c = self.cell(features[t], (h, c))
            hs.append(h)
            cs.append(c)
        return torch.stack(hs), torch.stack(cs)
