"""memest: how much accelerator memory a model needs, per device, before you rent the hardware."""

__version__ = "0.1.0"
