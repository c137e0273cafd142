"""Networks: encoders (MLP, Atari CNNs), an LSTM core, and the heads algorithms put on top of them."""

from rlfleet.nets.encoders import MLP, Mnih2013CNN, NatureCNN, make_encoder
from rlfleet.nets.heads import CategoricalHead, DuelingQHead, QHead, ValueHead
from rlfleet.nets.recurrent import LSTMCore

__all__ = [
    "MLP",
    "Mnih2013CNN",
    "NatureCNN",
    "make_encoder",
    "CategoricalHead",
    "DuelingQHead",
    "QHead",
    "ValueHead",
    "LSTMCore",
]
