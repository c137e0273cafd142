"""Networks: encoders (MLP, Atari CNNs), an LSTM core, the heads algorithms put on top of them, and the actors
and critic ensembles of the continuous off-policy agents."""

from rlfleet.nets.continuous import DeterministicActor, QEnsemble, SquashedGaussianActor
from rlfleet.nets.encoders import MLP, MinAtarCNN, Mnih2013CNN, NatureCNN, make_encoder
from rlfleet.nets.heads import CategoricalHead, DuelingQHead, QHead, ValueHead
from rlfleet.nets.recurrent import LSTMCore

__all__ = [
    "MLP",
    "MinAtarCNN",
    "Mnih2013CNN",
    "NatureCNN",
    "make_encoder",
    "CategoricalHead",
    "DuelingQHead",
    "QHead",
    "ValueHead",
    "LSTMCore",
    "DeterministicActor",
    "SquashedGaussianActor",
    "QEnsemble",
]
