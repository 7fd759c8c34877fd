"""The Qwen3.5 vision tower: its geometry at one image size, transformers' model fixed at
that size, its image steps and inputs, its family, its tiny checkpoints."""
