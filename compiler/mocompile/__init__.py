"""mocompile: compile MoE training intents into checked Megatron-Bridge recipes."""

__version__ = "0.1.0"
