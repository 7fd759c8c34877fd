"""The model half: how a model is described, loaded and fed -- the fields of a model
description, its families (transformers' classes, the Qwen3.5 tower), the architectures'
own code and tiny checkpoints, and how images and files become a model's inputs.

It knows nothing of targets: what a model becomes for a runtime is ``edgebuild/targets``'
and the kinds'. Kinds are thin declarations on both halves.
"""
