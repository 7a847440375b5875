"""Deprecated: the run state moved to `ablate.train` (state, recorder, checkpoint, device); this path is removed after one release."""

from ablate._moved import alias

__getattr__ = alias(__name__, "ablate.train.state", "ablate.train.recorder", "ablate.train.checkpoint", "ablate.train.device")
